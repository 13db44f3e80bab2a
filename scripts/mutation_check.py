"""Mutation check: inject one plausible bug at a time into a copy of the repository, run the tests meant to catch it.

    python scripts/mutation_check.py [--only NAME[,NAME...]] [--list] [--keep] [--jobs N]

The mutations live in ``scripts/mutations/``, one module a place of the code. Each replaces one exact snippet of
the package (the replacement must apply exactly once, so a refactor that moves the code makes the check fail loudly
instead of testing nothing), then runs its tests in the copy with ``pytest -x``. A mutation is caught only when those
tests fail **and** the tests that failed pass on an unmutated copy of the same tree (every mutation's failing tests
rerun there in one pytest run at the end): a test that fails for another reason (a missing package, a broken
fixture) is not a catch. Anything else survives: the script exits 1 and names it.
The copies hold the files of the working tree that git does not ignore and are installed nowhere: tests import the
package from the copy's root (``PYTHONPATH``), with this interpreter and its packages. ``--jobs`` mutations run at
once (default: one a core; the tests run on one thread each).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


sys.path.insert(0, str(Path(__file__).resolve().parent))
from mutations import Mutation, all_mutations, cpu_flags  # noqa: E402

MUTATIONS = all_mutations()


def copy_tree(destination: Path) -> None:
    """The files of the working tree git tracks or would track (uncommitted edits included), nothing ignored."""
    command = ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"]
    listed = subprocess.run(command, cwd=ROOT, capture_output=True, check=True).stdout
    for name in filter(None, listed.decode().split("\0")):
        source = ROOT / name
        if source.is_file():
            target = destination / name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)


FAILED_LINE = re.compile(r"^(?:FAILED|ERROR) (.+?)(?: - .*)?$")  # an id may hold spaces: "test[a b]"


def pytest_run(workdir: Path, tests: Sequence[str], env: dict[str, str]) -> tuple[int, str]:
    """pytest's exit code and output for ``tests`` in ``workdir`` (stop at the first failure, failures listed)."""
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-x", "-q", "-rfE", "-p", "no:cacheprovider", *tests],
        cwd=workdir, env=env, capture_output=True, text=True,
    )  # fmt: skip
    return done.returncode, done.stdout + done.stderr


def failed_tests(output: str) -> list[str]:
    """The node ids (or files, for an error while collecting) pytest's summary names as failed or in error."""
    ids = []
    for line in output.splitlines():
        match = FAILED_LINE.match(line.strip())
        if match:
            ids.append(match.group(1))
    return list(dict.fromkeys(ids))


@dataclass
class Trial:
    """A mutation's tests run on its mutated copy: the tests that failed (none: it survived)."""

    mutation: Mutation
    failed: list[str]
    seconds: float
    tail: str


@dataclass
class Verdict:
    mutation: Mutation
    caught: bool
    seconds: float
    detail: str


def run_mutation(mutation: Mutation, keep: bool) -> Trial:
    """Apply the mutation to a fresh copy and run its tests there (stopping at the first failure)."""
    workdir = Path(tempfile.mkdtemp(prefix=f"mutation-{mutation.name}-"))
    try:
        copy_tree(workdir)
        path = workdir / mutation.path
        text = path.read_text()
        count = text.count(mutation.old)
        if count != 1:
            raise SystemExit(
                f"{mutation.name}: the snippet occurs {count} times in {mutation.path}; update the mutation"
            )
        path.write_text(text.replace(mutation.old, mutation.new))
        env = {**os.environ, "HF_HUB_OFFLINE": "1", **dict(mutation.env)}
        started = time.perf_counter()
        code, output = pytest_run(workdir, mutation.tests, {**env, "PYTHONPATH": str(workdir)})
        tail = "\n".join(output.strip().splitlines()[-4:])
        failed = failed_tests(output) if code else []
        if code and (code not in (1, 2) or not failed):
            raise SystemExit(f"{mutation.name}: pytest could not run the tests (exit {code}):\n{tail}")
        return Trial(mutation, failed, time.perf_counter() - started, tail)
    finally:
        if not keep:
            shutil.rmtree(workdir, ignore_errors=True)


def prove(trials: Sequence[Trial], pristine: Path) -> list[Verdict]:
    """The verdicts of ``trials``: a mutation is caught only if the tests that failed with it pass on ``pristine``
    (an unmutated copy), since a test that fails for another reason (a missing package, a broken fixture) proves
    nothing. Every failing test of every trial is rerun there once, in one pytest run (not one per mutation), each
    mutation's own environment grouped."""
    broken: set[str] = set()
    groups: dict[tuple[tuple[str, str], ...], set[str]] = {}
    for trial in trials:
        groups.setdefault(tuple(sorted(trial.mutation.env)), set()).update(trial.failed)
    tails = []
    for env, ids in groups.items():
        if not ids:
            continue
        run_env = {**os.environ, "HF_HUB_OFFLINE": "1", **dict(env), "PYTHONPATH": str(pristine)}
        done = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-rfE", "-p", "no:cacheprovider", *sorted(ids)],
            cwd=pristine, env=run_env, capture_output=True, text=True,
        )  # fmt: skip
        broken.update(failed_tests(done.stdout + done.stderr))
        tails.append("\n".join((done.stdout + done.stderr).strip().splitlines()[-4:]))
    verdicts = []
    for trial in trials:
        if not trial.failed:
            verdicts.append(Verdict(trial.mutation, False, trial.seconds, trial.tail))
            continue
        # a collection error names its file: every test of that file failed too
        also = [test for test in trial.failed if any(test == bad or test.startswith(bad + "::") for bad in broken)]
        if also:
            detail = "failed with the mutation, and also WITHOUT it (not a catch): " + " ".join(also)
            detail += "\n" + "\n".join(tails)
            verdicts.append(Verdict(trial.mutation, False, trial.seconds, detail))
        else:
            verdicts.append(Verdict(trial.mutation, True, trial.seconds, f"caught by {' '.join(trial.failed)}"))
    return verdicts


def check_mutations(mutations: Sequence[Mutation], pristine: Path, jobs: int, keep: bool) -> list[Verdict]:
    """Run ``mutations`` ``jobs`` at once, then prove their catches on ``pristine`` in one batch (see :func:`prove`);
    each trial's line is printed as it ends."""
    trials = []
    with ThreadPoolExecutor(max(1, jobs)) as pool:
        for trial in pool.map(lambda m: run_mutation(m, keep), mutations):
            state = "failed" if trial.failed else "SURVIVED"
            print(f"{state:8} {trial.seconds:6.1f} s  {trial.mutation.name}", flush=True)
            trials.append(trial)
    return prove(trials, pristine)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", help="comma-separated mutation names")
    parser.add_argument("--list", action="store_true", help="list the mutations and exit")
    parser.add_argument("--keep", action="store_true", help="keep the mutated copies (their paths are printed)")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="mutations run at once (default: cores)")
    args = parser.parse_args()
    chosen = MUTATIONS
    if args.only:
        names = set(args.only.split(","))
        unknown = names - {m.name for m in MUTATIONS}
        if unknown:
            parser.error(f"unknown mutations {sorted(unknown)}")
        chosen = tuple(m for m in MUTATIONS if m.name in names)
    if args.list:
        for mutation in chosen:
            print(f"{mutation.name}: {mutation.what} ({mutation.path}; tests: {' '.join(mutation.tests)})")
        return 0
    flags = cpu_flags()
    inapplicable = [m for m in chosen if not set(m.cpu_flags) <= flags]
    for mutation in inapplicable:
        print(f"n/a      {mutation.name}: needs a CPU with {', '.join(mutation.cpu_flags)} to do harm; not run here")
    chosen = tuple(m for m in chosen if m not in inapplicable)
    started = time.perf_counter()
    pristine = Path(tempfile.mkdtemp(prefix="mutation-pristine-"))
    survivors = []
    try:
        copy_tree(pristine)
        print("each mutation's tests on its copy (failed: to be proven on the unmutated tree below)", flush=True)
        verdicts = check_mutations(chosen, pristine, args.jobs, args.keep)
        for verdict in verdicts:
            word = "caught" if verdict.caught else "SURVIVED"
            print(f"{word:8} {verdict.seconds:6.1f} s  {verdict.mutation.name}: {verdict.mutation.what}", flush=True)
            print("         " + verdict.detail.replace("\n", "\n         "), flush=True)
            if not verdict.caught:
                survivors.append(verdict.mutation.name)
    finally:
        shutil.rmtree(pristine, ignore_errors=True)
    minutes = (time.perf_counter() - started) / 60
    print(
        f"{len(chosen) - len(survivors)} of {len(chosen)} mutations caught, each proven on the unmutated tree "
        f"({minutes:.1f} min, {args.jobs} at once; {len(inapplicable)} not applicable on this CPU)"
    )
    return 1 if survivors else 0


if __name__ == "__main__":
    sys.exit(main())
