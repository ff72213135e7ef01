"""The README's demo screenshot: serve the app and photograph it with headless Chromium.

    python docs/scripts/demo_screenshot.py [--out docs/demo.png]
"""
from __future__ import annotations

import argparse
import shutil
import socket
import subprocess
from pathlib import Path

from vgen.demo import Demo, build_app


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=str(Path(__file__).resolve().parents[1] / "demo.png"))
    args = ap.parse_args()
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if not exe:
        raise SystemExit("needs chromium (apt-get install chromium)")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    app = build_app(Demo())
    app.launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True)
    try:
        subprocess.run([exe, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                        "--virtual-time-budget=15000", "--window-size=1280,720", f"--screenshot={args.out}",
                        f"http://127.0.0.1:{port}/"], check=True, capture_output=True, timeout=300)
    finally:
        app.close()
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
