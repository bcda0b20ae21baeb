#!/bin/sh
# Run one build command trusting the CA bundle passed as the BuildKit secret "ca".
# The secret is mounted at /run/secrets/ca for a single RUN and never lands in a
# layer; without it, every tool keeps its own trust store.
ca=/run/secrets/ca
apt_conf=/etc/apt/apt.conf.d/99-build-ca
if [ -s "$ca" ]; then
  # uv reads SSL_CERT_FILE, pip PIP_CERT, apt the option below (https mirrors only)
  export SSL_CERT_FILE="$ca" PIP_CERT="$ca" REQUESTS_CA_BUNDLE="$ca" CURL_CA_BUNDLE="$ca"
  echo "Acquire::https::CAInfo \"$ca\";" >"$apt_conf"
fi
"$@"
rc=$?
rm -f "$apt_conf"
exit $rc
