"""The pool-lease queue: intake of queued reservations and the batch worker."""
