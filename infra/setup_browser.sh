#!/usr/bin/env bash
# Install Debian's chromium (as root) for the browser tests of the Prefect and MLflow UIs (tests/integration/
# test_browser.py drives it with Python Playwright; Playwright's own browser download is not used).
set -euo pipefail
if command -v chromium >/dev/null; then
    echo "chromium present: $(chromium --version 2>/dev/null | head -1)"; exit 0
fi
if [[ $EUID -ne 0 ]]; then
    echo "setup_browser.sh: chromium is missing; run as root (apt-get install chromium)" >&2; exit 1
fi
echo "installing chromium (apt-get)…"
(apt-get update -qq || true)
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
chromium --version 2>/dev/null | head -1
