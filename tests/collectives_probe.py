"""Run under a framework's launcher by test_library_under_launchers: the library's collectives."""

import json
import sys

import unitrain

backend = unitrain.get_backend(sys.argv[1])
with backend.distributed() as dist:
    assert dist.world_size == 2, dist.world_size
    got = dist.broadcast({"from": dist.rank, "items": [1, 2]}, src=1)
    mean = dist.all_reduce(float(dist.rank + 1))
    biggest = dist.all_reduce([dist.rank, 10 - dist.rank], op="max")
    dist.barrier()
    if dist.is_main_process:
        print(json.dumps({"broadcast": got, "mean": mean, "max": list(map(float, biggest))}))
