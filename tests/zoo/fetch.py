#!/usr/bin/python3
"""Fetch the real-model zoo (tests/zoo/zoo.json) from the npm registry into a local cache.

Every zoo model is a file shipped inside an npm package tarball. For each model not yet in the
cache (or whose cached copy fails its checksum) this runs `npm pack PKG@VERSION` in a temporary
folder (npm checks the tarball against the registry's integrity hash), takes the model out of the
tarball — either one member, or for packages that ship a model split into chunks (the
@imgly/background-removal-data layout: dist/resources.json lists the chunk files in order) the
chunks concatenated — verifies the pinned sha256 and moves it into the cache as <id>.onnx.

Cache folder: $MTS_ZOO_CACHE, else ~/.cache/mtserve-zoo (outside the work tree, so a fresh clone
in CI reuses it). Offline and not cached: a clear error naming the missing models.

usage: fetch.py [--manifest tests/zoo/zoo.json] [--only ID[,ID...]] [--list]
Prints the cache path of every model; exits 1 if any model could not be fetched or verified.
"""
import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_MANIFEST = os.path.join(HERE, "zoo.json")


def cache_dir():
    d = os.environ.get("MTS_ZOO_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "mtserve-zoo")
    os.makedirs(d, exist_ok=True)
    return d


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def load_manifest(path):
    with open(path) as f:
        return json.load(f)


def model_path(model):
    return os.path.join(cache_dir(), model["id"] + ".onnx")


def cached_ok(model):
    p = model_path(model)
    return os.path.isfile(p) and os.path.getsize(p) == model["size"] and sha256_file(p) == model["sha256"]


def npm_pack(spec, workdir):
    """Downloads the tarball of spec (name@version) into workdir; returns its path."""
    if shutil.which("npm") is None:
        raise RuntimeError("npm is not installed (scripts/install-deps.sh installs it)")
    try:
        r = subprocess.run(["npm", "pack", "--loglevel", "error", spec], cwd=workdir, capture_output=True, text=True,
                           timeout=900)
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"npm pack {spec} timed out (slow or no network?)")
    if r.returncode != 0:
        err = (r.stderr or r.stdout).strip().splitlines()
        err = [l for l in err if "Unknown user config" not in l and "will stop working" not in l]
        key = [l for l in err if any(k in l for k in (" code ", " errno ", "network", "request to", "404"))]
        raise RuntimeError(f"npm pack {spec} failed (offline? the registry unreachable?): "
                           + " | ".join((key or err)[-3:]))
    name = r.stdout.strip().splitlines()[-1] if r.stdout.strip() else ""
    path = os.path.join(workdir, name)
    if not name or not os.path.isfile(path):
        tgz = [f for f in os.listdir(workdir) if f.endswith(".tgz")]
        if len(tgz) != 1:
            raise RuntimeError(f"npm pack {spec}: cannot find the downloaded tarball")
        path = os.path.join(workdir, tgz[0])
    return path


def extract(tar, model, dest):
    """Writes the model's bytes from the open tarball to dest."""
    with open(dest, "wb") as out:
        if model.get("chunks_index"):
            # the model is split into chunk files listed in a JSON index inside the tarball
            idx = json.load(tar.extractfile(model["chunks_index"]))
            entry = idx.get(model["path"])
            if entry is None:
                raise RuntimeError(f"{model['chunks_index']} has no entry '{model['path']}'")
            base = os.path.dirname(model["chunks_index"])
            for c in entry["chunks"]:
                member = tar.extractfile(base + "/" + c["hash"])
                shutil.copyfileobj(member, out)
        else:
            try:
                member = tar.extractfile(model["path"])
            except KeyError:
                member = None
            if member is None:
                raise RuntimeError(f"{model['path']} is not a file in the tarball")
            shutil.copyfileobj(member, out)


def fetch(models, quiet=False):
    """Ensures every model is in the cache; returns a list of error strings."""
    errors = []
    todo = [m for m in models if not cached_ok(m)]
    by_pkg = {}
    for m in todo:
        by_pkg.setdefault(f"{m['package']}@{m['version']}", []).append(m)
    for spec, ms in by_pkg.items():
        if not quiet:
            print(f"fetch: npm pack {spec} ({', '.join(m['id'] for m in ms)})", file=sys.stderr)
        with tempfile.TemporaryDirectory(prefix="mts-zoo-") as tmp:
            try:
                tgz = npm_pack(spec, tmp)
                with tarfile.open(tgz, "r:gz") as tar:
                    for m in ms:
                        part = os.path.join(cache_dir(), m["id"] + ".onnx.part")
                        try:
                            extract(tar, m, part)
                            got = sha256_file(part)
                            if got != m["sha256"]:
                                raise RuntimeError(f"sha256 mismatch: got {got}, manifest pins {m['sha256']}")
                            os.replace(part, model_path(m))
                        except Exception as e:  # one bad model must not hide the others
                            errors.append(f"{m['id']}: {spec} {m['path']}: {e}")
                        finally:
                            if os.path.exists(part):
                                os.unlink(part)
            except Exception as e:
                for m in ms:
                    errors.append(f"{m['id']}: {e}")
    return errors


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--manifest", default=DEFAULT_MANIFEST)
    ap.add_argument("--only", default="", help="comma-separated model ids")
    ap.add_argument("--list", action="store_true", help="only list the models and whether they are cached")
    a = ap.parse_args()
    man = load_manifest(a.manifest)
    models = man["models"]
    if a.only:
        want = set(a.only.split(","))
        unknown = want - {m["id"] for m in models}
        if unknown:
            sys.exit(f"fetch: unknown model id(s): {', '.join(sorted(unknown))}")
        models = [m for m in models if m["id"] in want]
    if a.list:
        for m in models:
            print(f"{m['id']:28s} {'cached' if cached_ok(m) else 'missing':8s} {m['package']}@{m['version']} {m['path']}")
        return 0
    errors = fetch(models)
    if errors:
        print("fetch: could not get these zoo models (the npm registry must be reachable the first time;"
              f" the cache is {cache_dir()}):", file=sys.stderr)
        for e in errors:
            print("  " + e, file=sys.stderr)
        return 1
    for m in models:
        print(model_path(m))
    return 0


if __name__ == "__main__":
    sys.exit(main())
