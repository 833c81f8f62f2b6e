# A stand-in for the official redis:7 image where no registry is reachable: Debian's
# redis-server (7.0) on the same base. compose.yaml gives it its command and settings.
ARG BASE_IMAGE=rollbox-base:bookworm
FROM ${BASE_IMAGE}
RUN apt-get update && apt-get install -y --no-install-recommends redis-server && rm -rf /var/lib/apt/lists/*
WORKDIR /data
CMD ["redis-server"]
