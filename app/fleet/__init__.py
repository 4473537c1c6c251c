"""Seed 004: explainable completion-time placement across daemon hosts and Slurm/PBS lanes.

Pure functions over the ``vq.*`` documents (explain, fleet build, compare); no SQL, no clock, no network
except the SSH collection at the edge.
"""
