"""``tests.helpers.with_files_at``: a program finds files at fixed paths that are not on the machine."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.helpers import with_files_at


def test_a_command_reads_files_at_paths_that_exist_only_in_its_own_mount_namespace(tmp_path: Path) -> None:
    missing = tmp_path / "absent" / "certs" / "tls.crt"  # its parent folders do not exist either
    beside = tmp_path / "kept.txt"
    beside.write_text("the machine's own file")
    files = {missing: b"certificate", Path("/etc/kube-ferry-test/metrics/tls.key"): b"key"}
    command = with_files_at(files, tmp_path / "layers",
                            ["sh", "-c", f'cat "{missing}" /etc/kube-ferry-test/metrics/tls.key "{beside}"'])
    out = subprocess.run(command, capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    assert out.stdout == "certificatekeythe machine's own file"  # overlaid folders keep what was there
    assert not missing.parent.parent.exists() and not Path("/etc/kube-ferry-test").exists()
