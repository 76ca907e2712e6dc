"""Scale-out on Ray: the `generate` and `helm` jobs over many engines, one per GPU (or CPU slot).

- `cluster`: connect to (or start) a Ray cluster with clear errors, and size the workers.
- `pool`: a pool of engine actors that runs shards of work and retries a lost worker's shards.
- `generate`, `helm`: the engine actors and drivers for the two commands; results are merged
  on the driver into the same files a single process writes.

Ray is an optional dependency (`pip install 'flexlamps[ray]'`): nothing here imports it at
module import, and `cluster.import_ray` says how to install it when it is missing.
"""
