"""The failure handling's metrics through the multiprocess exporter (issue 45): a process with its own
PROMETHEUS_MULTIPROC_DIR copies the counts per action and the ceiling, which reads +Inf once it is lifted (the
files keep a series once written)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = textwrap.dedent(
    """
    import asyncio, json, os, sys
    from prometheus_client import CollectorRegistry
    from prometheus_client.multiprocess import MultiProcessCollector
    from async_batcher import AsyncBatcher
    from async_batcher.failures import SplitOn
    from async_batcher.metrics_multiprocess import MultiprocessExporter

    class Gpu(AsyncBatcher[int, int]):
        fits = 4
        async def process_batch(self, batch):
            if len(batch) > self.fits:
                raise MemoryError
            return batch

    def scrape():
        registry = CollectorRegistry()
        MultiProcessCollector(registry, os.environ["PROMETHEUS_MULTIPROC_DIR"])
        return {
            f"{s.name}{sorted(s.labels.items())}": s.value
            for family in registry.collect() for s in family.samples if s.name.startswith("async_batcher_")
            and ("failure_handling" in s.name or "ceiling" in s.name)
        }

    async def main():
        gpu = Gpu(max_batch_size=16, max_queue_time=0.001, split_on=SplitOn(MemoryError, grow_after=1, grow_by=16))
        exporter = MultiprocessExporter(gpu, interval=3600, histograms=None)
        exporter.start()
        await asyncio.gather(*(gpu.process(x) for x in range(16)))
        exporter.sync()
        during = scrape()
        gpu.fits = 16
        while gpu.stats.ceilings:
            await asyncio.gather(*(gpu.process(x) for x in range(16)))
        exporter.sync()
        after = scrape()
        await exporter.stop()
        await gpu.stop()
        print(json.dumps({"during": during, "after": after}))

    asyncio.run(main())
    """
)


def test_the_exporter_copies_each_action_and_the_ceiling(tmp_path: Path) -> None:
    env = {"PROMETHEUS_MULTIPROC_DIR": str(tmp_path), "PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    during, after = seen["during"], seen["after"]
    splits = "async_batcher_failure_handling_total[('action', 'split'), ('batcher', 'Gpu')]"
    assert during[splits] == 2  # 16 -> 8 -> 4
    assert [value for name, value in during.items() if name.startswith("async_batcher_batch_ceiling")] == [4.0]
    assert after[splits] == 2
    assert [value for name, value in after.items() if name.startswith("async_batcher_batch_ceiling")] == [math.inf]
