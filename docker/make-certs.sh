#!/usr/bin/env bash
# Certificates for the demo cluster's TLS: a CA, and one certificate/key that the scheduler,
# the workers and the job's client all present (distributed verifies the peer's certificate
# against the CA in both directions; it does not check host names).
#
#   docker/make-certs.sh [DIR]      (default: docker/certs; existing files are kept)
#
# DIR gets ca.pem, cluster.pem, cluster-key.pem (mounted into the containers) and
# private/ca-key.pem (mounted nowhere: whoever holds it can mint cluster certificates).
# Demo material only: a real cluster gets its certificates from its own PKI.
set -euo pipefail

dir="${1:-$(cd "$(dirname "$0")" && pwd)/certs}"
days="${CERT_DAYS:-30}"
mkdir -p "$dir/private"
chmod 700 "$dir/private"

if [[ -s "$dir/ca.pem" && -s "$dir/cluster.pem" && -s "$dir/cluster-key.pem" ]]; then
    echo "certificates already in $dir (remove them to make new ones)"
    exit 0
fi

umask 077
openssl req -x509 -newkey rsa:2048 -nodes -sha256 -days "$days" \
    -keyout "$dir/private/ca-key.pem" -out "$dir/ca.pem" \
    -subj "/CN=dask-compact demo CA" \
    -addext "basicConstraints=critical,CA:TRUE" \
    -addext "keyUsage=critical,keyCertSign,cRLSign" 2>/dev/null

openssl req -newkey rsa:2048 -nodes -sha256 \
    -keyout "$dir/cluster-key.pem" -out "$dir/private/cluster.csr" \
    -subj "/CN=dask-compact demo cluster" 2>/dev/null

cat > "$dir/private/cluster.ext" <<'EOF'
basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth,clientAuth
subjectAltName=DNS:scheduler,DNS:localhost,IP:127.0.0.1
EOF

openssl x509 -req -sha256 -days "$days" -in "$dir/private/cluster.csr" \
    -CA "$dir/ca.pem" -CAkey "$dir/private/ca-key.pem" -CAcreateserial \
    -CAserial "$dir/private/ca.srl" \
    -extfile "$dir/private/cluster.ext" -out "$dir/cluster.pem" 2>/dev/null

rm -f "$dir/private/cluster.csr"
# Readable by the container user (root in the demo image); the CA key stays private.
chmod 644 "$dir/ca.pem" "$dir/cluster.pem"
chmod 600 "$dir/cluster-key.pem"
openssl verify -CAfile "$dir/ca.pem" "$dir/cluster.pem" >/dev/null
echo "wrote $dir/ca.pem, $dir/cluster.pem, $dir/cluster-key.pem"
