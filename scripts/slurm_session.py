"""A session of ``reproduce --launcher slurm`` on a real Slurm, recorded for the cluster how-to
(docs/how-to/cluster.md shows it: ``scripts/docs_outputs.py`` inserts the transcript, so what
the page shows was printed by this run, not typed).

It starts the one-node cluster of this machine (``scripts/slurm_local.sh start``), has sbatch
refuse a partition that does not exist, runs the smoke isoloss study as two shards through
sbatch — the first one's task requeued with ``scontrol requeue`` once it has a checkpoint,
as a preemption does — then the study with default flags, which reuses both shards and
writes the report; and compares its numbers with a run of the local launcher. Each command
and what it printed (stdout and stderr, as a terminal shows them) goes to the transcript:

    python scripts/slurm_session.py OUT TRANSCRIPT
    python scripts/docs_outputs.py --page docs/how-to/cluster.md \\
        --run slurm=OUT/runs/isoloss-smoke --log slurm=TRANSCRIPT

As root, on a machine where ``apt-get install slurm-wlm munge`` works (the start script
installs them where missing). About 5 minutes on an idle 2-core CPU.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STUDY = ["isoloss", "--scale", "smoke", "--no-progress"]


class Transcript:
    def __init__(self, path: Path, out: Path):
        self.path, self.out = path, out
        self.lines: list[str] = []
        self.env = {**os.environ, "OMP_NUM_THREADS": "1",
                    "PYTHONPATH": str(ROOT / "src") + os.pathsep + os.environ.get("PYTHONPATH", "")}

    def show(self, argv: list[str], shown: str | None = None) -> None:
        self.lines.append("$ " + (shown or " ".join(shlex.quote(a) for a in argv)))

    def output(self, text: str) -> None:
        self.lines += text.rstrip("\n").splitlines() if text.strip() else []
        self.path.write_text("\n".join(self.lines) + "\n", encoding="utf-8")

    def run(self, argv: list[str], shown: str | None = None, ok=(0,)) -> str:
        self.show(argv, shown)
        started = time.perf_counter()
        done = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=self.env,
                              cwd=self.out)
        self.output(done.stdout)
        if done.returncode not in ok:
            raise SystemExit(f"{shown or argv}: exit {done.returncode}\n{done.stdout}")
        return f"{time.perf_counter() - started:.0f} s"

    def start(self, argv: list[str], shown: str | None = None) -> subprocess.Popen:
        self.show(argv, (shown or " ".join(argv)) + " &")
        return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=self.env,
                                cwd=self.out)


def sameloss(*args: str) -> list[str]:
    return [sys.executable, "-m", "sameloss.cli", *args]


def wait_for(condition, what: str, seconds: float = 900) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.2)


def main(out: Path, transcript: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    t = Transcript(transcript, out)
    t.run(["bash", str(ROOT / "scripts" / "slurm_local.sh"), "start"], "bash scripts/slurm_local.sh start")
    t.run(sameloss("reproduce", *STUDY, "--launcher", "slurm", "--slurm-partition", "gpu", "--out", "runs"),
          "sameloss reproduce isoloss --scale smoke --launcher slurm --slurm-partition gpu", ok=(2,))
    # shard 1: seed 0, its task requeued once its base has a checkpoint
    root = out / "runs" / "isoloss-smoke"
    shard = t.start(sameloss("reproduce", *STUDY, "--launcher", "slurm", "--seeds", "0", "--out", "runs"),
                    "sameloss reproduce isoloss --scale smoke --launcher slurm --seeds 0")
    wait_for(lambda: any((root / "seeds" / "seed0").glob("runs/*/checkpoints/step_*/meta.json")), "a checkpoint")
    log = next((root / "submitit").glob("*_0_log.out"))
    task = log.name[:-len("_0_log.out")]
    t.run(["squeue", "-o", "%.8i %.9P %.16j %.2t %.6M %R"], "squeue")
    t.run(["scontrol", "requeue", task])
    t.output(shard.communicate()[0])
    t.run(["grep", "-h", "REQUEUE", str(log.with_name(log.name.replace(".out", ".err")))],
          f"grep REQUEUE runs/isoloss-smoke/submitit/{log.name.replace('.out', '.err')}")
    # shard 2, then the study: default flags, the shards reused, the report written
    t.run(sameloss("reproduce", *STUDY, "--launcher", "slurm", "--seeds", "1-2", "--out", "runs"),
          "sameloss reproduce isoloss --scale smoke --launcher slurm --seeds 1-2")
    t.run(sameloss("reproduce", *STUDY, "--launcher", "slurm", "--out", "runs"),
          "sameloss reproduce isoloss --scale smoke --launcher slurm")
    # the same study on the local launcher: the same numbers
    t.run(["sh", "-c", " ".join(shlex.quote(a) for a in sameloss("reproduce", *STUDY, "--launcher", "local", "--out",
                                                                  "local")) + " > /dev/null"],
          "sameloss reproduce isoloss --scale smoke --launcher local --out local > /dev/null")
    t.run(["cmp", "runs/isoloss-smoke/differences.csv", "local/isoloss-smoke/differences.csv"])
    t.output("(cmp prints nothing: the two files are byte-identical)")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    main(Path(sys.argv[1]).resolve(), Path(sys.argv[2]).resolve())
