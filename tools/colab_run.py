"""Run chosen notebooks as a Colab reader first does: each copied alone into an empty folder, in a fresh Python that
has only what Colab has before the first cell (torch, numpy, matplotlib, ipykernel), its set-up cell active.

    python tools/colab_run.py book/01_tokens.ipynb book/10_transformer.ipynb book/13_translator.ipynb
    python tools/colab_run.py --python python3.13 --torch torch==2.11.0 book/13_translator.ipynb

The set-up cell clones the repository from its public URL; here git rewrites that URL to a local copy of the
commit under test (the working tree's tracked files, uncommitted changes included), so nothing leaves the machine
and the cell runs unchanged. A notebook passes when every cell runs without an error, the set-up cell worked in
a copy of the repository, and the library it installed is the one in this working tree.

With --packages-from PYTHON the fresh runtime's torch, numpy, matplotlib, ipykernel and what they require are hard
links of the files installed in that Python's environment (the same versions, the same files), not a second pip
install: a CUDA build of torch is several GB to unpack.
"""
import argparse
import filecmp
import json
import os
import shutil
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import nbformat
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import install_cell  # noqa: E402

COLAB_PACKAGES = ["numpy", "matplotlib", "ipykernel"]  # beside torch, what a Colab runtime has that we need
KERNEL = "colab-like"


def run(*args: str | Path, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([str(a) for a in args], check=True, **kwargs)


def commit_under_test() -> str:
    """A commit of the working tree's tracked files: HEAD, plus uncommitted changes when there are some."""
    identity = ["-c", "user.name=colab-run", "-c", "user.email=colab-run@localhost"]  # CI may have none
    stash = run("git", *identity, "stash", "create", cwd=ROOT, capture_output=True, text=True).stdout.strip()
    return stash or run("git", "rev-parse", "HEAD", cwd=ROOT, capture_output=True, text=True).stdout.strip()


def serve_repository(work: Path) -> Path:
    """A bare repository whose BOOK_REF is the commit under test, and a git configuration that sends the
    repository URL there. Returns the configuration file (for GIT_CONFIG_GLOBAL)."""
    mirror = work / "repository.git"
    run("git", "init", "-q", "--bare", mirror)
    ref = install_cell.git_ref()
    target = f"refs/tags/{ref}" if install_cell.is_release(install_cell.version()) else f"refs/heads/{ref}"
    run("git", "push", "-q", mirror, f"{commit_under_test()}:{target}", cwd=ROOT)
    config = work / "gitconfig"
    config.write_text(f'[url "file://{mirror}"]\n\tinsteadOf = {install_cell.repository_url()}\n'
                      "[advice]\n\tdetachedHead = false\n")
    return config


# Run by the Python whose environment already holds the packages: the files of torch, of Colab's other packages
# and of everything they require (with the extras a requirement names), as {"site": site-packages, "version":
# "3.13.0", "torch": "2.11.0", "files": [paths relative to site-packages]}, or {"missing": name} for a requirement
# it lacks.
CLOSURE = r"""
import json, platform, re, sys, sysconfig
from importlib import metadata
from pip._vendor.packaging.requirements import Requirement
wanted, seen, files = [(name, "") for name in sys.argv[1:]], set(), []
while wanted:  # (a distribution, one of its extras that a requirement asked for, or "")
    name, extra = wanted.pop()
    name = re.sub(r"[-_.]+", "-", name).lower()
    if (name, extra) in seen:
        continue
    first = not any(seen_name == name for seen_name, _ in seen)
    seen.add((name, extra))
    try:
        dist = metadata.distribution(name)
    except metadata.PackageNotFoundError:
        print(json.dumps({"missing": name})); sys.exit()
    if dist.files is None:
        print(json.dumps({"missing": name + " (no RECORD)"})); sys.exit()
    if first:
        files += [str(f) for f in dist.files if not str(f).startswith("..")]
    for text in dist.requires or []:
        req = Requirement(text)
        if req.marker is None or req.marker.evaluate({"extra": extra}):
            wanted += [(req.name, "")] + [(req.name, e) for e in req.extras]
print(json.dumps({"site": sysconfig.get_paths()["purelib"], "version": platform.python_version(),
                  "torch": metadata.version("torch"), "files": files}))
"""


def linked_packages(venv: Path, source: Path, torch_spec: str) -> str | None:
    """Give venv, made without pip, the installed files of pip, torch, Colab's other packages and their
    requirements from the environment of the Python `source`, as hard links (a second install of a CUDA build of
    torch writes several GB; the links are the same files). None when done; else why not (another Python, another
    torch, a package missing there, a link that failed)."""
    try:
        found = json.loads(run(source, "-c", CLOSURE, "pip", "torch", *COLAB_PACKAGES,
                               capture_output=True, text=True).stdout)
        if "missing" in found:
            return f"{found['missing']} is not installed there"
        ours = run(venv / "bin" / "python", "-c", "import platform, sysconfig; "
                   "print(platform.python_version(), sysconfig.get_paths()['purelib'])",
                   capture_output=True, text=True).stdout.split()
        if ours[0] != found["version"]:
            return f"its Python is {found['version']}, the runtime's {ours[0]}"
        if torch_spec.startswith("torch==") and found["torch"].split("+")[0] != torch_spec[len("torch=="):]:
            return f"it has torch {found['torch']}, not {torch_spec}"
        site, target = Path(found["site"]), Path(ours[1])
        for name in found["files"]:
            if (site / name).is_file():
                (target / name).parent.mkdir(parents=True, exist_ok=True)
                os.link(site / name, target / name)  # the runtime's site-packages held nothing: no file exists
    except (OSError, subprocess.CalledProcessError, ValueError, KeyError, IndexError) as error:
        return f"linking failed: {error}"  # another file system, say, or a Python that does not run
    check = subprocess.run([venv / "bin" / "python", "-m", "pip", "check"], capture_output=True, text=True)
    return None if check.returncode == 0 else f"pip check: {check.stdout.strip()}"


def fresh_python(work: Path, torch_spec: str, python: str = sys.executable, packages_from: str | None = None) -> Path:
    """A new virtual environment of `python` with torch and Colab's other preinstalled packages: pip installs them,
    unless the environment of the Python `packages_from` holds them (torch as torch_spec asks), whose files it
    then links into an environment made empty (without pip, which comes linked too, and without the setuptools
    that Python 3.11's venv adds), so that no file of another version stays beside them."""
    venv = work / "venv"
    why_not = "none named"
    if packages_from:
        run(python, "-m", "venv", "--without-pip", venv)
        why_not = linked_packages(venv, Path(packages_from), torch_spec)
        if why_not is not None:
            shutil.rmtree(venv)  # a partly linked environment is started again, for pip
    if why_not is None:
        print(f"torch and {', '.join(COLAB_PACKAGES)} linked from the environment of {packages_from}")
    else:
        print(f"torch and {', '.join(COLAB_PACKAGES)} installed by pip (from another environment: {why_not})")
        run(python, "-m", "venv", venv)
        run(venv / "bin" / "python", "-m", "pip", "install", "-q", torch_spec, *COLAB_PACKAGES)
    return venv


def runtime_for(notebook: Path, venv: Path, work: Path) -> tuple[Path, str]:
    """A copy of the fresh environment for one notebook (Colab gives each notebook a runtime of its own), registered
    as a kernel; its python and the kernel's name."""
    copy = work / f"venv-{notebook.stem}"
    # hard links: a CUDA build of torch is several GB, and nothing installed later writes into its files
    shutil.copytree(venv, copy, symlinks=True, copy_function=os.link)
    name = f"{KERNEL}-{notebook.stem}".lower().replace("_", "-")
    run(copy / "bin" / "python", "-m", "ipykernel", "install", "--prefix", work / "jupyter", "--name", name,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return copy / "bin" / "python", name


def execute_alone(notebook: str, work: str) -> str:
    """Execute one notebook copied alone into an empty folder, in its own runtime; say what happened."""
    source, work_dir = Path(notebook), Path(work)
    python, kernel = runtime_for(source, work_dir / "venv", work_dir)
    folder = work_dir / f"alone-{source.stem}"
    folder.mkdir()
    shutil.copy(ROOT / source, folder / source.name)
    os.environ["TRANSFORMER_LIB_CACHE"] = str(folder / "cache")  # the kernel's own cache, as in a new runtime
    nb = nbformat.read(folder / source.name, as_version=4)
    start = time.perf_counter()
    NotebookClient(nb, timeout=1200, kernel_name=kernel, resources={"metadata": {"path": str(folder)}}).execute()
    nbformat.write(nb, folder / source.name)
    first = next(c for c in nb.cells if c.cell_type == "code")
    said = "".join(o.get("text", "") for o in first.outputs if o.output_type == "stream")
    if "Working in transformer-book/book" not in said:
        raise RuntimeError(f"{source.name}: the set-up cell did not work in a copy of the repository: {said!r}")
    if not (folder / "transformer-book" / "results").is_dir():
        raise RuntimeError(f"{source.name}: no results/ in the notebook's copy of the repository")
    differ = same_files(installed_library(python), ROOT / "transformer_lib")
    if differ:
        raise RuntimeError(f"{source.name}: the set-up cell installed another transformer_lib than this working "
                           f"tree's: {differ}")
    return f"{source.name}: every cell ran and the installed library is this working tree's ({time.perf_counter() - start:.0f} s)"


def installed_library(python: Path) -> Path:
    """The folder of the transformer_lib that the fresh Python imports."""
    code = "import pathlib, transformer_lib; print(pathlib.Path(transformer_lib.__file__).parent)"
    return Path(run(python, "-c", code, capture_output=True, text=True, cwd="/").stdout.strip())


def same_files(a: Path, b: Path) -> list[str]:
    """The .py files that differ between two package folders, or exist in one only."""
    names = {p.name for p in a.glob("*.py")} | {p.name for p in b.glob("*.py")}
    return sorted(n for n in names if not ((a / n).exists() and (b / n).exists()
                                           and filecmp.cmp(a / n, b / n, shallow=False)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("notebooks", nargs="+")
    parser.add_argument("--work", type=Path, default=ROOT / "_build" / "colab-like", help="a folder to start afresh")
    parser.add_argument("--torch", default=os.environ.get("TORCH_SPEC", "torch==2.13.0"), help="pip's torch spec")
    parser.add_argument("--python", default=sys.executable,
                        help="the Python of the fresh runtimes (default: this one)")
    parser.add_argument("--packages-from", metavar="PYTHON",
                        help="link the runtime's packages from this Python's environment where it holds them "
                             "(default: pip installs them)")
    parser.add_argument("--jobs", type=int, default=2, help="notebooks at once")
    args = parser.parse_args()
    start = time.perf_counter()
    shutil.rmtree(args.work, ignore_errors=True)
    args.work.mkdir(parents=True)
    work = args.work.resolve()
    venv = fresh_python(work, args.torch, args.python, args.packages_from)
    version = run(venv / "bin" / "python", "-c", "import platform; print(platform.python_version())",
                  capture_output=True, text=True).stdout.strip()
    print(f"fresh Python {version} with {args.torch} and {', '.join(COLAB_PACKAGES)} ({time.perf_counter() - start:.0f} s)")
    # The kernels see what a Colab runtime would: no repository on the path, the public URL served locally.
    for name in ("PYTHONPATH", "VIRTUAL_ENV"):
        os.environ.pop(name, None)
    os.environ.update(GIT_CONFIG_GLOBAL=str(serve_repository(work)), JUPYTER_PATH=str(work / "jupyter" / "share" / "jupyter"))
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        for line in pool.map(execute_alone, args.notebooks, [str(work)] * len(args.notebooks)):
            print(line)
    print(f"done in {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
