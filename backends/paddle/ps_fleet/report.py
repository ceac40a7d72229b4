"""What Fleet reports it ran, read back from it rather than copied from the request: the mode from
its runtime's context, the rewritten program's ops, the steps per update its client's flags make,
the sparse table's rows as the servers print them, and the servers' brpc request counters."""

from __future__ import annotations

import logging
import re
import time
import urllib.request
from typing import Any, Dict, Optional

import paddle

from unitrain.backends.paddle.ps_fleet.client import merged_pushes
from unitrain.backends.paddle.ps_fleet.tables import sparse_tables
from unitrain.host.console import captured_stdout

log = logging.getLogger("unitrain")

# The servers' brpc counters (its built-in /vars page on each server's port): requests served.
# console=1: plain text (brpc answers a browser-like client with HTML).
COUNTERS = re.compile(r"^cost_profiler_pserver_server_(pull|push)_(sparse|dense)_count : (\d+)$", re.M)
#: What Fleet's client prints for print_table_stat, summed over the servers.
TABLE_STAT = re.compile(r"table id: \d+, feasign size: (\d+),")
#: Seconds the client may take to print after its call returned (it prints after it answers).
PRINT_WAIT_S = 5.0
#: The program's ops that carry a parameter server's traffic.
TRAFFIC_OPS = {"distributed_lookup_table", "distributed_push_sparse", "send", "recv", "send_barrier", "fetch_barrier"}


def mode(runtime: Any) -> str:
    """The mode Fleet runs (sync, async, half_async, geo), from its runtime's context."""
    from paddle.distributed.ps.utils.public import DistributedMode

    modes = {getattr(DistributedMode, name): name.lower() for name in ("SYNC", "ASYNC", "HALF_ASYNC", "GEO")}
    return modes.get(runtime.context["ps_mode"], str(runtime.context["ps_mode"]))


def engine(runtime: Any, main: Any, ran: str) -> Dict[str, Any]:
    """The engine, its mode ``ran``, and what the rewritten program ``main`` does of it."""
    context = runtime.context
    ops = {op.type for op in main.global_block().ops}
    return {
        "engine": f"Paddle Fleet parameter server (brpc), paddle {paddle.__version__}",
        "sync": ran,
        "geo_k_steps": context["user_defined_strategy"].a_sync_configs["k_steps"] if ran == "geo" else None,
        "steps_per_update": merged_pushes(runtime.ps_desc_builder.ps_desc.init_gflags) if ran == "async" else None,
        "pulls_sparse": "distributed_lookup_table" in ops,
        "program_ops": sorted(ops & TRAFFIC_OPS),
        "dense": "each trainer's copy, merged on the servers" if ran == "geo" else "on the servers",
    }


def table_rows(runtime: Any) -> Optional[Dict[str, Any]]:
    """Rows of the sparse tables as the servers hold them. Fleet's client has no call that
    returns them: its print_table_stat asks every server and prints the sum on this process's
    standard output, where it is read. (Saving the table and counting the saved rows cost a
    third of a small job's CPU: a gzip file for each of its 1000 shards.)"""
    table = sparse_tables(runtime)["deep_table"]
    with captured_stdout(pass_on=True) as printed:
        runtime._worker.print_table_stat(table, 0, 0)
        deadline = time.monotonic() + PRINT_WAIT_S
        while not TABLE_STAT.search(printed()) and time.monotonic() < deadline:
            time.sleep(0.01)
    found = TABLE_STAT.search(printed())
    if found is None:
        log.warning("Fleet's client printed no table statistics: the table rows are not reported")
        return None
    return {"rows": int(found.group(1)), "bytes": None}


def server_counters(endpoints) -> Optional[Dict[str, int]]:
    totals: Dict[str, int] = {}
    for endpoint in endpoints:
        try:
            # Straight to the server: a proxy set in the environment must not see loopback requests.
            with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(
                f"http://{endpoint}/vars?console=1", timeout=5
            ) as page:
                text = page.read().decode("utf-8", "replace").replace("\r", "")
        except OSError:
            return None
        for way, kind, count in COUNTERS.findall(text):
            key = f"{way}_{kind}_requests"
            totals[key] = totals.get(key, 0) + int(count)
    return totals or None
