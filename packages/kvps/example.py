"""kvps in 30 lines: run with `mpiexec -n 2 python example.py`."""

import numpy as np

import kvps

kvps.setup(num_keys=1000, num_threads=1, use_techniques="all")
server = kvps.Server(8)  # every key holds 8 float32 values
w = kvps.Worker(0, server)
rank = server.my_rank()

keys = np.array([1, 2, 3, 500], dtype=np.int64)
w.push(keys, np.ones(4 * 8, dtype=np.float32))  # adds; every rank pushes once
w.barrier()

vals = np.zeros(4 * 8, dtype=np.float32)
ts = w.pull(keys, vals)  # remote keys: a timestamp, already waited for
print(f"rank {rank}: pull ts={ts}, key 1 = {vals[:8]}")

# intent: we will use keys 10..19 during clocks [0, 5) -> moved/replicated here
hot = np.arange(10, 20, dtype=np.int64)
w.intent(hot, w.current_clock(), w.current_clock() + 5)
w.wait_sync()
buf = np.zeros(10 * 8, dtype=np.float32)
assert w.pull(hot, buf) == -1  # answered locally
ts = w.push(hot, np.full(10 * 8, 0.5, dtype=np.float32), True)  # asynchronous
w.wait(ts)
w.finalize()
server.shutdown()
