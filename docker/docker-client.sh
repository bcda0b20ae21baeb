# shellcheck shell=bash
# Sourced by docker/build.sh and docker/base/build-base.sh: DOCKER, a client whose
# `docker build` is BuildKit: one with buildx, or Debian's docker.io client, which has
# BuildKit built in (DOCKER_BUILDKIT=1). A client without either fails a BuildKit build.
if [ -z "${DOCKER:-}" ]; then
  if docker buildx version >/dev/null 2>&1; then DOCKER=docker
  elif [ -x /usr/bin/docker ]; then DOCKER=/usr/bin/docker
  else DOCKER=docker; fi
fi
export DOCKER DOCKER_BUILDKIT=1
