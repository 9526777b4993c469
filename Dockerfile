# Production image: web (gunicorn), worker and beat all run from it; docker-compose.yml wires them.
FROM python:3.11-slim AS base
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1
RUN useradd --create-home --uid 1000 lineage
WORKDIR /app
COPY pyproject.toml README.md ./
COPY . .
RUN pip install --no-cache-dir . \
    && DEBUG=false SECRET_KEY=build-only DATABASE_URL=postgres://build/build REDIS_URL=redis://build:6379/0 \
       python manage.py collectstatic --no-input
USER lineage
EXPOSE 8000
CMD ["gunicorn", "config.wsgi:application", "--bind", "0.0.0.0:8000", "--workers", "3", "--access-logfile", "-"]
