# The simulated node-exporter fleet for docker-compose.yml (a development tool: the sandbox's parts on top of the
# project; the service images never contain it).
ARG BASE_IMAGE=python:3.11-slim
FROM ${BASE_IMAGE}
WORKDIR /src
COPY . .
RUN python3 -m venv /opt/fleet && /opt/fleet/bin/pip install --no-cache-dir --disable-pip-version-check .
ENV PATH=/opt/fleet/bin:$PATH PYTHONPATH=/src/sandbox PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
USER 65532:65532
ENTRYPOINT ["python3", "/src/deploy/compose/fleet.py"]
