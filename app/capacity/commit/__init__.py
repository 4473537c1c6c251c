"""The guarded commit: lost-race vocabulary, the single-node commit, cuts of allocations at an instant."""
