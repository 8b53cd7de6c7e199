"""`python -m pager.bench.s3local BUCKET -- COMMAND…`: run a command against a local S3 server.

Starts moto's standalone server (the `test` extra) on 127.0.0.1 and a free port, creates the
bucket, runs the command with PAGER_S3_ENDPOINT, PAGER_S3_REGION and test credentials set, and
stops the server. For benchmarks on object storage without a cloud account, for example:

    python -m pager.bench.s3local bench -- pager bench scale --pages 2000 --db s3://bench/scale
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request


def main(argv: list[str]) -> int:
    if "--" not in argv or argv.index("--") != 1:
        print(__doc__.splitlines()[0], file=sys.stderr)
        return 2
    bucket, command = argv[0], argv[2:]
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    endpoint = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryFile() as log:
        server = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                                  stdout=subprocess.DEVNULL, stderr=log)
        try:
            started = time.perf_counter()
            while True:
                if server.poll() is not None:
                    print("the local S3 server exited; is moto[server] installed?", file=sys.stderr)
                    return 1
                try:
                    urllib.request.urlopen(f"{endpoint}/moto-api/", timeout=5).read()
                    break
                except OSError:
                    time.sleep(0.05)
            print(f"local S3 server answering after {time.perf_counter() - started:.2f} s", file=sys.stderr)
            import boto3

            boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="test",
                         aws_secret_access_key="test").create_bucket(Bucket=bucket)
            env = {**os.environ, "AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test",
                   "PAGER_S3_ENDPOINT": endpoint, "PAGER_S3_REGION": "us-east-1", "PAGER_S3_ALLOW_HTTP": "true"}
            return subprocess.run(command, env=env).returncode
        finally:
            server.terminate()
            server.wait(timeout=30)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
