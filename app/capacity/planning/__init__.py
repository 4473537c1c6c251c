"""Planning reads: the pool snapshot and its cache, the shortlist SQL, the batch's shared reads."""
