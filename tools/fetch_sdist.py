"""Downloads a package's source distribution from PyPI's simple index into a folder.

`pip download --no-binary` would build the sdist's metadata, which for vLLM needs its
whole build environment; the Makefile's vllm target only wants the tarball.
Usage: fetch_sdist.py NAME VERSION DEST_DIR"""

import hashlib
import os
import re
import sys
import urllib.request

name, version, dest = sys.argv[1:4]
fname = f"{name}-{version}.tar.gz"
index = urllib.request.urlopen(f"https://pypi.org/simple/{name}/", timeout=120).read().decode()
urls = [u for u in re.findall(r'href="([^"]+)"', index) if u.split("#")[0].endswith("/" + fname)]
if not urls:
    sys.exit(f"fetch_sdist: no {fname} on the index")
os.makedirs(dest, exist_ok=True)
url, _, frag = urls[0].partition("#")
path = os.path.join(dest, fname)
urllib.request.urlretrieve(url, path)
if frag.startswith("sha256="):  # the index publishes the digest: check the download against it
    with open(path, "rb") as f:
        if hashlib.sha256(f.read()).hexdigest() != frag[len("sha256="):]:
            os.remove(path)
            sys.exit(f"fetch_sdist: {fname} does not match the index's sha256")
print(f"fetch_sdist: {fname} -> {dest}")
