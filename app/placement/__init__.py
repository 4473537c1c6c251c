"""The pure half of placement (docs/placement-rules.md, "The pipeline"): snapshot in, plan out.

Nothing in this package performs I/O, reads a clock or touches SQL; a test enforces that it imports
no ``sqlalchemy``, ``fastapi``, ``asyncpg`` or ``app.db``.
"""
