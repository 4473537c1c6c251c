"""The reservation service: create, read, release, preview, bulk, who may act on one, and usage accounting."""
