"""The reservation service: create, read, release, preview, bulk, and who may act on one."""
