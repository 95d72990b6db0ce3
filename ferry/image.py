"""``make image``: one OCI image with both daemons (``ferry scheduler``, ``ferry vnode``), built without a
container engine, then checked by running its entry point.

A Debian bookworm root file system from Debian's packages (mmdebstrap: python3 and CA certificates
only), the project and its dependencies as wheels from PyPI installed into ``/opt/kube-ferry`` for that
Python, a non-root user, entry point ``ferry``; packed into an OCI layout by umoci. Push it with
``skopeo copy oci:build/image/oci:<tag> docker://<registry>/kube-ferry:<tag>``.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MIRROR = "http://deb.debian.org/debian"
TOOLS = {"mmdebstrap": "mmdebstrap", "umoci": "umoci"}
ENTRY = """#!/usr/bin/python3
import sys
sys.path.insert(0, "/opt/kube-ferry/lib")
from ferry.cli import main
sys.exit(main())
"""


def step(what: str, argv: list[str], **kw: object) -> None:
    t0 = time.monotonic()
    print(f"image: {what} ...", flush=True)
    res = subprocess.run(argv, capture_output=True, text=True, check=False, **kw)  # type: ignore[call-overload]
    if res.returncode != 0:
        sys.exit(f"image: {what} failed ({' '.join(argv[:3])} ...): {res.stderr.strip()[-800:]}")
    print(f"image: {what} done ({time.monotonic() - t0:.0f} s)", flush=True)


def main() -> None:
    from ferry import __version__

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=ROOT / "build" / "image")
    parser.add_argument("--tag", default=__version__)
    parser.add_argument("--mirror", default=MIRROR, help="Debian mirror for the base file system")
    args = parser.parse_args()
    missing = [pkg for tool, pkg in TOOLS.items() if shutil.which(tool) is None]
    if missing:
        sys.exit(f"image: needs {', '.join(missing)}: apt-get install {' '.join(missing)}")
    out: Path = args.out
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    layout, bundle = out / "oci", out / "bundle"
    image = f"{layout}:{args.tag}"
    step("OCI layout", ["umoci", "init", "--layout", str(layout)])
    step("empty image", ["umoci", "new", "--image", image])
    step("bundle", ["umoci", "unpack", "--image", image, str(bundle)])
    rootfs = bundle / "rootfs"
    shutil.rmtree(rootfs)
    step("Debian bookworm with python3 (mmdebstrap)",
         ["mmdebstrap", "--variant=essential", "--include=python3,ca-certificates", "--aptopt=Acquire::Retries=3",
          "bookworm", str(rootfs), args.mirror])
    wheels = out / "wheels"
    step("wheel of kube-ferry", [sys.executable, "-m", "pip", "wheel", "--no-deps", "-w", str(wheels), str(ROOT)])
    wheel = next(wheels.glob("kube_ferry-*.whl"))
    lib = rootfs / "opt" / "kube-ferry" / "lib"
    step("kube-ferry and its dependencies (wheels for CPython 3.11, manylinux x86_64)",
         [sys.executable, "-m", "pip", "install", "--quiet", "--target", str(lib), "--only-binary=:all:",
          "--python-version", "3.11", "--implementation", "cp", "--platform", "manylinux2014_x86_64",
          "--platform", "manylinux_2_28_x86_64", str(wheel)])
    entry = rootfs / "usr" / "local" / "bin" / "ferry"
    entry.parent.mkdir(parents=True, exist_ok=True)
    entry.write_text(ENTRY)
    entry.chmod(0o755)
    with (rootfs / "etc" / "passwd").open("a") as f:
        f.write("ferry:x:65532:65532:kube-ferry:/nonexistent:/usr/sbin/nologin\n")
    with (rootfs / "etc" / "group").open("a") as f:
        f.write("ferry:x:65532:\n")
    for cache in ("var/cache/apt", "var/lib/apt/lists"):
        shutil.rmtree(rootfs / cache, ignore_errors=True)
    step("layer", ["umoci", "repack", "--image", image, str(bundle)])
    step("config", ["umoci", "config", "--image", image, "--config.entrypoint", "/usr/local/bin/ferry",
                    "--config.user", "65532:65532", "--config.workingdir", "/",
                    "--config.env", "PYTHONDONTWRITEBYTECODE=1", "--config.env", "PYTHONUNBUFFERED=1",
                    "--config.label", f"org.opencontainers.image.version={__version__}",
                    "--config.label", "org.opencontainers.image.title=kube-ferry"])
    shutil.rmtree(bundle)
    check = out / "check"
    step("unpack for the check", ["umoci", "unpack", "--image", image, str(check)])
    res = subprocess.run(["chroot", "--userspec=65532:65532", str(check / "rootfs"), "/usr/local/bin/ferry",
                          "--version"], capture_output=True, text=True, check=False)
    shutil.rmtree(check)
    if res.returncode != 0 or __version__ not in res.stdout:
        sys.exit(f"image: the entry point did not run: {res.stdout}{res.stderr}")
    size = sum(f.stat().st_size for f in (layout / "blobs").rglob("*") if f.is_file())
    print(f"image: {image} ({size / 2**20:.0f} MiB); its entry point says: {res.stdout.strip()}")


if __name__ == "__main__":
    main()
