# Production image: web (gunicorn), worker, llm worker and beat all run from it; docker-compose.yml wires them.
# Two stages: the build stage installs the pinned dependencies (pylock.toml, `make lock`) in a layer of their own,
# which a change of code does not rebuild, then the project as a wheel (no source tree in the image); the runtime
# stage copies the virtualenv alone. The embedded Postgres and Redis of `make run` (the `local` extra) are not in it.
FROM python:3.11-slim AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
# pip installs from pylock.toml from 25.1
RUN python -m venv /venv && /venv/bin/pip install --upgrade "pip>=26.1"
COPY pylock.toml /build/pylock.toml
RUN /venv/bin/pip install -r /build/pylock.toml
COPY . /build/src
RUN /venv/bin/pip install --no-deps /build/src \
    && cd /tmp && DEBUG=false SECRET_KEY=build-only STATIC_ROOT=/venv/staticfiles \
       DATABASE_URL=postgres://build/build REDIS_URL=redis://build:6379/0 /venv/bin/lineage collectstatic --no-input

FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PATH=/venv/bin:$PATH \
    STATIC_ROOT=/venv/staticfiles LINEAGE_DATA_DIR=/data
RUN useradd --create-home --uid 1000 lineage && mkdir /data && chown lineage /data
COPY --from=build /venv /venv
WORKDIR /home/lineage
USER lineage
EXPOSE 8000
CMD ["gunicorn", "config.wsgi:application", "--bind", "0.0.0.0:8000", "--workers", "3", "--access-logfile", "-"]
