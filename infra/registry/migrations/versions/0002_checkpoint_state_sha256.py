"""checkpoints.state_sha256: canonical hash of the training state (equal for equal states)

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-03 12:00:00
"""

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("checkpoints") as batch:
        batch.add_column(sa.Column("state_sha256", sa.String(length=64), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("checkpoints") as batch:
        batch.drop_column("state_sha256")
