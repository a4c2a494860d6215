"""bench/gpu_check.py runs end to end (CPU, tiny shape): the GPU machine's one-shot script is not broken."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_gpu_check_prints_its_table_and_result_line():
    out = subprocess.run([sys.executable, "bench/gpu_check.py", "--device", "cpu", "--shape", "tiny", "--quick"],
                         capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.strip().splitlines()
    assert any(line.startswith("train step") for line in lines)
    fields = dict(kv.split("=") for kv in lines[-1].split()[1:])
    assert lines[-1].startswith("RESULT ") and float(fields["gen_tok_s"]) > 0 and float(fields["train_tok_s"]) > 0
    assert float(fields["sync_gb_s"]) > 0 and float(fields["sync_colocated_ms"]) > 0
    # every figure of the report is measured in the run: the HF baseline and the packed trainer too
    assert float(fields["hf_static_tok_s"]) > 0 and float(fields["gen_vs_hf"]) > 0 and float(fields["pack_tok_s"]) > 0
    assert any(line.startswith("generation (HF static cache)") for line in lines)
