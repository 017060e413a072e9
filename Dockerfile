# The hai-airflow product image: `hai serve` with the PostgreSQL driver and the docker and kubernetes
# backends (no Airflow, no torch: training code brings its own image).
#
#   docker build -t REGISTRY/hai-airflow:0.1.0 .
#   docker run -v "$PWD/config.toml:/etc/hai/config.toml:ro" -e HAI_ADMIN_TOKEN=... -p 8765:8765 REGISTRY/hai-airflow:0.1.0
#
# deploy/kubernetes/ runs it in a cluster. BASE may be any Debian image with python3 >= 3.11 and its
# venv module (e.g. a mirror of the default in a registry of your own).
ARG BASE=python:3.11-slim-bookworm
FROM ${BASE}

# git: the docker backend clones git code sources on the server side.
RUN apt-get update \
    && apt-get install -y --no-install-recommends git \
    && rm -rf /var/lib/apt/lists/*

# The package in a virtual environment of its own, apart from the base's Python.
COPY pyproject.toml README.md /src/
COPY hai_airflow /src/hai_airflow
RUN python3 -m venv /opt/hai \
    && /opt/hai/bin/pip install --no-cache-dir --disable-pip-version-check '/src[server,docker,kubernetes]' \
    && rm -rf /src

# Numeric user and group, so Kubernetes' runAsNonRoot can verify them; deploy/kubernetes uses the same.
RUN groupadd --system --gid 10001 hai \
    && useradd --system --uid 10001 --gid hai --home-dir /var/lib/hai --no-create-home hai \
    && install -d -o 10001 -g 10001 -m 0700 /var/lib/hai \
    && install -d -m 0755 /etc/hai
USER 10001:10001
ENV PATH=/opt/hai/bin:$PATH \
    HAI_HOME=/var/lib/hai \
    PYTHONUNBUFFERED=1
WORKDIR /var/lib/hai

EXPOSE 8765
HEALTHCHECK --interval=10s --timeout=5s --start-period=60s \
    CMD ["python3", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8765/health', timeout=4)"]
ENTRYPOINT ["hai"]
CMD ["serve", "--config", "/etc/hai/config.toml", "--host", "0.0.0.0", "--port", "8765"]
