# better-compute: installed the way the README does, migrated, then served.
FROM python:3.11-slim

ENV PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1
WORKDIR /srv/better-compute
COPY pyproject.toml README.md alembic.ini ./
COPY app ./app
COPY alembic ./alembic
COPY examples ./examples
RUN pip install -e .

EXPOSE 8000
# migrations first, then the service (DATABASE_URL comes from the environment, see compose.yaml)
CMD ["sh", "-c", "better-compute migrate && better-compute serve --host 0.0.0.0 --port 8000"]
