#!/usr/bin/env bash
# Certificates for the demo cluster's TLS: a CA, and one certificate/key that the scheduler,
# the workers and the job's client all present (distributed verifies the peer's certificate
# against the CA in both directions; it does not check host names).
#
#   docker/make-certs.sh [DIR]      (default: docker/certs)
#
# DIR gets ca.pem, cluster.pem, cluster-key.pem (mounted into the containers) and
# private/ca-key.pem (mounted nowhere: whoever holds it can mint cluster certificates).
# They are valid for CERT_DAYS days (default 30). Certificates already in DIR are kept while
# they are valid for another day, and made anew otherwise (expired ones failed the demo with
# "certificate has expired").
# Demo material only: a real cluster gets its certificates from its own PKI.
set -euo pipefail

dir="${1:-$(cd "$(dirname "$0")" && pwd)/certs}"
days="${CERT_DAYS:-30}"

if [[ ! "$days" =~ ^[1-9][0-9]*$ ]]; then
    echo "make-certs.sh: CERT_DAYS must be a whole number of days, 1 or more, not '$days'" >&2
    exit 2
fi

# openssl's messages are shown when a step fails, less its key generation's progress dots
# (nothing is shown when it succeeds).
run_openssl() {
    local out
    if ! out="$(openssl "$@" 2>&1)"; then
        echo "make-certs.sh: openssl $1 failed:" >&2
        grep -v -E '^[.+*]+$' <<<"$out" >&2 || true
        exit 1
    fi
}

# A certificate is kept while it has another day to run, or half of CERT_DAYS where that is
# less: a 1-day certificate has less than a day from its start, and was made anew (its CA
# too, under running containers) at every run (a review)
margin=$(( days * 43200 < 86400 ? days * 43200 : 86400 ))

valid_for_a_day() {  # a certificate that will not have expired within the margin
    openssl x509 -checkend "$margin" -noout -in "$1" >/dev/null 2>&1
}

expiry() {
    openssl x509 -enddate -noout -in "$1" | cut -d= -f2
}

mkdir -p "$dir/private"
chmod 700 "$dir/private"

if [[ -s "$dir/ca.pem" && -s "$dir/cluster.pem" && -s "$dir/cluster-key.pem" ]]; then
    if valid_for_a_day "$dir/ca.pem" && valid_for_a_day "$dir/cluster.pem" \
        && openssl verify -CAfile "$dir/ca.pem" "$dir/cluster.pem" >/dev/null 2>&1; then
        echo "certificates already in $dir, valid until $(expiry "$dir/cluster.pem")" \
            "(remove them to make new ones)"
        exit 0
    fi
    echo "certificates in $dir have expired, expire within a day or do not verify" \
        "(until $(expiry "$dir/cluster.pem" 2>/dev/null || echo '?')): making new ones"
fi

umask 077
run_openssl req -x509 -newkey rsa:2048 -nodes -sha256 -days "$days" \
    -keyout "$dir/private/ca-key.pem" -out "$dir/ca.pem" \
    -subj "/CN=dask-compact demo CA" \
    -addext "basicConstraints=critical,CA:TRUE" \
    -addext "keyUsage=critical,keyCertSign,cRLSign"

run_openssl req -newkey rsa:2048 -nodes -sha256 \
    -keyout "$dir/cluster-key.pem" -out "$dir/private/cluster.csr" \
    -subj "/CN=dask-compact demo cluster"

cat > "$dir/private/cluster.ext" <<'EXT'
basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth,clientAuth
subjectAltName=DNS:scheduler,DNS:localhost,IP:127.0.0.1
EXT

run_openssl x509 -req -sha256 -days "$days" -in "$dir/private/cluster.csr" \
    -CA "$dir/ca.pem" -CAkey "$dir/private/ca-key.pem" -CAcreateserial \
    -CAserial "$dir/private/ca.srl" \
    -extfile "$dir/private/cluster.ext" -out "$dir/cluster.pem"

rm -f "$dir/private/cluster.csr"
# Readable by the container user (root in the demo image); the CA key stays private.
chmod 644 "$dir/ca.pem" "$dir/cluster.pem"
chmod 600 "$dir/cluster-key.pem"
run_openssl verify -CAfile "$dir/ca.pem" "$dir/cluster.pem"
echo "wrote $dir/ca.pem, $dir/cluster.pem, $dir/cluster-key.pem," \
    "valid for $days days (until $(expiry "$dir/cluster.pem"))"
