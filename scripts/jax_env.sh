#!/usr/bin/env bash
# Environments with other JAX versions than .venv's (issue 42): a Debian 13 (trixie) root,
# Python 3.13, made with debootstrap, holding one virtual environment per JAX version.
#
#   scripts/jax_env.sh build VERSION...       make (or reuse) the root and the venvs
#   scripts/jax_env.sh run VERSION CMD...     run CMD in the repository, in that venv
#   scripts/jax_env.sh path VERSION           print the venv's path on this host
#
# VERSION is `latest` (the newest JAX on the package index when the venv was made) or a
# release (`0.11.2`, the GPU machine's). Needs root and the package registries only: the
# root comes from Debian's archive (debootstrap's default mirror), the venvs from the
# host's pip configuration (its files and PIP_* variables are copied in, with the CA
# bundle, resolv.conf and hosts). Everything lives under $JAX_ENV_DIR (default:
# .jax-envs/ in the repository, git-ignored) and is reused when present; JAX_ENV_REFRESH=1
# remakes the venvs named (e.g. to pick up a newer `latest`).
#
# `run` works in a private mount namespace (unshare): /proc, /dev, /sys and the repository
# (at /repo) are mounted inside it only, and the kernel drops them when the command ends,
# however it ends, so no stale mount is ever left on the host.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
ENV_DIR="${JAX_ENV_DIR:-$REPO/.jax-envs}"
ROOT="$ENV_DIR/root"
SUITE="${JAX_ENV_SUITE:-trixie}"
# Variables handed to commands inside the root (pip's settings, certificates, proxies, CI),
# and the grid scripts' knobs (scripts/*grid*.sh, scripts/cpu_grids.sh): without them
# `STATUS=1 scripts/jax_env.sh run latest bash scripts/cpu_grids.sh` would run the queue.
# PYTHON is not: a host path means nothing inside the root.
GRID_ENV='STATUS|LIST|FROM|TO|MODELS|SEEDS|LRS|TASKS|LANGUAGE|FINISHED_IN|FOREGROUND|AT_TRAINING_LENGTH'
PASS_ENV="^(PIP_[A-Z_]*|SSL_CERT_FILE|SSL_CERT_DIR|REQUESTS_CA_BUNDLE|CURL_CA_BUNDLE|[Hh][Tt][Tt][Pp][Ss]?_[Pp][Rr][Oo][Xx][Yy]|[Nn][Oo]_[Pp][Rr][Oo][Xx][Yy]|CI|TERM|JAX_[A-Z_]*|XLA_FLAGS|PYTEST_ADDOPTS|PYTHONPATH|$GRID_ENV)="

die() { echo "jax_env: $*" >&2; exit 1; }
log() { echo "jax_env: $*" >&2; }

venv_name() { echo "jax-$1"; }

# The host's files that make the network and pip work, copied into the root on every use
# (they may change between runs; none of them is written into the repository).
sync_host_files() {
  local f
  for f in /etc/resolv.conf /etc/hosts /etc/hostname /etc/ssl/certs/ca-certificates.crt \
           /etc/pip.conf /root/.config/pip/pip.conf /root/.pip/pip.conf; do
    if [ -f "$f" ]; then
      mkdir -p "$ROOT$(dirname "$f")"
      cp -L "$f" "$ROOT$f"
    fi
  done
  if [ -d /etc/xdg/pip ]; then
    rm -rf "$ROOT/etc/xdg/pip"
    mkdir -p "$ROOT/etc/xdg"
    cp -rL /etc/xdg/pip "$ROOT/etc/xdg/pip"
  fi
}

make_root() {
  if [ -f "$ROOT/.jax-env-root" ]; then
    return
  fi
  [ "$(id -u)" = 0 ] || die "debootstrap needs root"
  if ! command -v debootstrap >/dev/null; then
    log "installing debootstrap (apt-get)"
    apt-get update -q >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q debootstrap >/dev/null
  fi
  # A half-made root (an interrupted debootstrap) is started again from scratch.
  rm -rf "$ROOT"
  mkdir -p "$ENV_DIR"
  log "debootstrap $SUITE into $ROOT"
  local start=$SECONDS
  debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates \
    "$SUITE" "$ROOT" >"$ENV_DIR/debootstrap.log" 2>&1 \
    || { tail -20 "$ENV_DIR/debootstrap.log" >&2; die "debootstrap failed (log: $ENV_DIR/debootstrap.log)"; }
  mkdir -p "$ROOT/repo"
  touch "$ROOT/.jax-env-root"
  log "root made in $((SECONDS - start)) s"
}

# Runs "$@" (a command inside the root) with the repository at /repo, in a private mount
# namespace: the mounts vanish with the namespace when the command ends.
in_root() {
  [ -f "$ROOT/.jax-env-root" ] || die "no root at $ROOT (scripts/jax_env.sh build first)"
  sync_host_files
  local envs=() line
  while IFS= read -r line; do envs+=("$line"); done < <(env | grep -E "$PASS_ENV" || true)
  # Local package folders that the host's pip configuration names (find-links, file://
  # indexes), mounted read-only at the same paths (else pip warns about each, per package).
  local dirs
  dirs=$( { cat /etc/pip.conf /etc/xdg/pip/*.conf /root/.config/pip/pip.conf \
              /root/.pip/pip.conf 2>/dev/null; env | grep -E '^PIP_' || true; } \
          | grep -oE '(file://)?/[^[:space:],;"]+' | sed 's|^file://||' | sort -u \
          | while read -r d; do
              d=${d%/}; [ -d "$d" ] || d=$(dirname "$d"); [ -d "$d" ] || continue
              # A PEP 503 index (.../simple) links to files beside it: mount its parent.
              [ "$(basename "$d")" = simple ] && d=$(dirname "$d")
              case "$d" in /|/etc|/etc/*|/dev*|/proc*|/sys*|/tmp) continue ;; esac
              echo "$d"; done | sort -u)
  # The inner script mounts, then replaces itself by chroot: nothing to unmount by hand.
  unshare --mount --propagation private -- /bin/bash -c '
    set -e
    root=$1; repo=$2; dirs=$3; shift 3
    mount -t proc proc "$root/proc"
    mount --rbind /dev "$root/dev"
    mount --rbind /sys "$root/sys" 2>/dev/null || true
    mount --bind "$repo" "$root/repo"
    for d in $dirs; do
      mkdir -p "$root$d" && mount --bind "$d" "$root$d" \
        && { mount -o remount,bind,ro "$root$d" 2>/dev/null || true; }
    done
    exec chroot "$root" "$@"' in_root "$ROOT" "$REPO" "$dirs" \
    /usr/bin/env -i HOME=/root LANG=C.UTF-8 \
    PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin "${envs[@]}" "$@"
}

req_hash() {
  cat "$REPO/requirements.txt" "$REPO/requirements-dev.txt" | sha256sum | cut -c1-16
}

make_venv() {
  local version=$1 name venv spec stamp
  name=$(venv_name "$version")
  venv="$ROOT/venvs/$name"
  stamp="$venv/.installed"
  if [ -f "$stamp" ] && [ -z "${JAX_ENV_REFRESH:-}" ] \
      && [ "$(sed -n 1p "$stamp")" = "$(req_hash)" ]; then
    log "$name: reusing ($(sed -n 2p "$stamp"))"
    return
  fi
  if [ "$version" = latest ]; then
    spec="jax jaxlib"
  else
    spec="jax==$version jaxlib==$version"
  fi
  log "$name: pip install -r requirements-dev.txt $spec"
  local start=$SECONDS
  rm -rf "$venv"
  in_root /bin/bash -c "set -e
    python3 -m venv /venvs/$name
    /venvs/$name/bin/python -m pip install -q --upgrade pip
    cd /repo
    /venvs/$name/bin/python -m pip install -q --upgrade -r requirements-dev.txt $spec"
  local got
  got=$(in_root "/venvs/$name/bin/python" -c \
    'import sys, jax, jaxlib; print(f"jax {jax.__version__}, jaxlib {jaxlib.__version__}, Python {sys.version.split()[0]}")')
  printf '%s\n%s\n' "$(req_hash)" "$got" >"$stamp"
  log "$name: $got (made in $((SECONDS - start)) s)"
}

cmd=${1:-}
[ $# -gt 0 ] && shift
case "$cmd" in
  build)
    [ $# -gt 0 ] || die "build: name at least one VERSION (latest, 0.11.2, ...)"
    make_root
    for version in "$@"; do make_venv "$version"; done
    ;;
  run)
    [ $# -ge 2 ] || die "run VERSION CMD..."
    version=$1; shift
    venv="/venvs/$(venv_name "$version")"
    [ -f "$ROOT$venv/.installed" ] || die "no venv for $version (scripts/jax_env.sh build $version)"
    # $1 and its arguments run from /repo with the venv's bin/ first on PATH.
    in_root /bin/bash -c 'cd /repo && export VIRTUAL_ENV=$0 PATH="$0/bin:$PATH" && exec "$@"' \
      "$venv" "$@"
    ;;
  path)
    [ $# -eq 1 ] || die "path VERSION"
    echo "$ROOT/venvs/$(venv_name "$1")"
    ;;
  *)
    sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//' >&2
    exit 2
    ;;
esac
