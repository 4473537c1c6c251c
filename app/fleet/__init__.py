"""docs/explain.md: explainable completion-time placement across daemon hosts and Slurm/PBS lanes.

Pure functions over the ``vq.*`` documents (explain, fleet build, compare); no SQL, no clock, no network
except at the edges named in :data:`IO_EDGES`: the SSH transport, the collection that drives it, and the
CLI that reads files and this host's clock. Every other module of this package is pure, and
``tests/fleet/test_fleet_purity.py`` holds each of them to it.
"""

IO_EDGES = ("app.fleet.ssh", "app.fleet.collect", "app.fleet.cli")
"""The fleet's I/O edges (SSH, collection, CLI): the only modules here that may touch hosts, files or the
clock. No other fleet module may import them."""
