"""One measuring run: its sections in turn, each written as it ends; a failed one logged and the
others measured; Ctrl-C or SIGTERM ends every command started and keeps the finished sections."""

from __future__ import annotations

import shutil
import signal
import sys
import time
from pathlib import Path
from typing import Dict, List

from .bench import Bench
from .machine import machine
from .markdown import markdown
from .processes import Stopped, ignore_interrupts, stop_on_termination
from .results import merge, save
from .sections import BY_NAME
from .settings import SECTIONS


def new_results(bench: Bench, previous: Dict) -> Dict:
    """This run's results before it measures anything: what it does not measure again stays,
    each row with the run that measured it."""
    config = {
        "model": bench.size.model,
        "image_size": bench.size.image,
        "batch_size": bench.batch,
        "steps": bench.size.steps,
        "warmup": bench.size.warmup,
        "repeats": bench.repeats,
        "pairs": bench.pairs,
        "quick": bench.quick,
    }
    started = time.strftime("%Y-%m-%dT%H:%M:%S")
    here = machine()
    results = {
        "machine": here,
        "config": config,
        "started": started,
        "runs": {**previous.get("runs", {}), started: {"machine": here, "config": config}},
    }
    results.update({section: previous.get(section) or [] for section in SECTIONS})
    return results


class Session:
    def __init__(self, bench: Bench, sections: List[str], out: Path, results: Dict):
        self.bench, self.sections, self.out, self.results = bench, sections, out, results
        self.failed: Dict[str, str] = {}
        self.current: str | None = None  # the section an interrupt stops

    def run(self) -> int:
        """0, 1 when a section failed, or 128 + the signal that stopped it."""
        clock = time.time()
        stop_on_termination()
        try:
            for section in self.sections:
                self.current = section
                print(f"[{time.time() - clock:6.0f} s] {section} ...", flush=True)
                self.measure(section)
        except (KeyboardInterrupt, Stopped) as e:
            return self.interrupted(e.signum if isinstance(e, Stopped) else signal.SIGINT)
        finally:
            self.bench.stop()
            shutil.rmtree(self.bench.work, ignore_errors=True)
        return self.finished(clock)

    def measure(self, section: str) -> None:
        log = self.out / f"failed_{section}.log"
        try:
            rows = BY_NAME[section](self.bench).measure()
        except RuntimeError as e:
            # One failed command should not cost the hour's other sections; the full error is kept.
            self.failed[section] = str(e)
            log.write_text(str(e) + "\n")
            print(
                f"run.py: section {section} failed: {str(e).splitlines()[0]} (its earlier rows are kept; "
                f"the error is in {log})",
                file=sys.stderr,
                flush=True,
            )
            return
        for row in rows:
            row["measured_at"] = self.results["started"]
        self.results[section] = merge(self.results[section], rows, section)
        save(self.out, self.results)
        log.unlink(missing_ok=True)  # an earlier failure of it no longer holds

    def interrupted(self, signum: int) -> int:
        ignore_interrupts()
        self.bench.stop()
        section = self.current
        done = [s for s in self.sections[: self.sections.index(section) if section else 0] if s not in self.failed]
        print(
            f"run.py: stopped by {signal.Signals(signum).name} during {section}: its commands are ended; "
            + (
                f"the finished sections ({', '.join(done)}) are in {self.out / 'results.json'}"
                if done
                else "no section had finished: nothing was written"
            ),
            file=sys.stderr,
        )
        return 128 + signum

    def finished(self, clock: float) -> int:
        written = [s for s in self.sections if s not in self.failed]
        where = (
            f"written to {self.out}/results.json, results.md and results.png"
            if written
            else f"nothing written: {self.out} is as it was"
        )
        print(markdown(self.results) + f"\n{self.bench.runs} runs in {time.time() - clock:.0f} s; {where}")
        if self.failed:
            print(
                f"run.py: {len(self.failed)} section(s) failed: {', '.join(self.failed)}; "
                f"see {self.out}/failed_<section>.log",
                file=sys.stderr,
            )
            return 1
        return 0
