#!/bin/sh
# verify-provenance.sh CA_CERT SIGNER DIR
#
# Verifies, offline and with no Airlock code, what `airlock job download`
# wrote in DIR: that DIR/provenance.json is a DSSE envelope of an in-toto
# statement signed by SIGNER (a SPIFFE ID, e.g.
# spiffe://airlock.example.com/service/executor) with a certificate that
# chains to CA_CERT and is valid now, and that the statement's subject is
# DIR/bundle.tar by its sha256. Needs sh, jq, openssl (1.1.1 or 3.x),
# base64, sha256sum and wc. Exits 0 and prints the statement's predicate
# when everything holds, 1 (saying what failed) otherwise. See
# docs/auditing.md.
set -eu

if [ $# -ne 3 ]; then
	echo "usage: $0 CA_CERT SIGNER DIR" >&2
	exit 2
fi
ca=$1 signer=$2 dir=$3
envelope=$dir/provenance.json
bundle=$dir/bundle.tar
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

fail() {
	echo "NOT VERIFIED: $*" >&2
	exit 1
}

payload_type=application/vnd.in-toto+json

# 1. The envelope: one signature over an in-toto payload.
[ "$(jq -r '.payloadType' "$envelope")" = "$payload_type" ] || fail "payloadType is not $payload_type"
[ "$(jq '.signatures | length' "$envelope")" = 1 ] || fail "want exactly one signature"

# 2. The signer: the first certificate chains to the CA (any others are
# intermediates), is valid now, and its URI SAN is SIGNER.
jq -r '.certificates[0]' "$envelope" >"$work/leaf.pem"
jq -r '.certificates[1:][]' "$envelope" >"$work/chain.pem"
set -- -CAfile "$ca"
[ -s "$work/chain.pem" ] && set -- "$@" -untrusted "$work/chain.pem"
openssl verify "$@" "$work/leaf.pem" >/dev/null 2>"$work/verify.err" ||
	fail "the signing certificate does not chain to $ca: $(cat "$work/verify.err")"
openssl x509 -in "$work/leaf.pem" -noout -ext subjectAltName >"$work/san.txt"
# The SAN line lists every name, comma-separated: keep the URIs.
tail -n +2 "$work/san.txt" | tr ',' '\n' | sed -n 's/^ *URI://p' >"$work/uris.txt"
[ "$(wc -l <"$work/uris.txt")" -eq 1 ] && grep -qxF "$signer" "$work/uris.txt" ||
	fail "the signing certificate is $(cat "$work/uris.txt"), not $signer"

# 3. The signature: over DSSE's pre-authentication encoding of the
# payload, "DSSEv1 <len(type)> <type> <len(payload)> <payload>".
jq -r '.payload' "$envelope" | base64 -d >"$work/payload.json"
jq -r '.signatures[0].sig' "$envelope" | base64 -d >"$work/sig.der"
printf 'DSSEv1 %d %s %d ' "${#payload_type}" "$payload_type" "$(($(wc -c <"$work/payload.json")))" >"$work/pae"
cat "$work/payload.json" >>"$work/pae"
openssl x509 -in "$work/leaf.pem" -noout -pubkey >"$work/pub.pem"
openssl dgst -sha256 -verify "$work/pub.pem" -signature "$work/sig.der" "$work/pae" >/dev/null ||
	fail "the signature does not verify with the signing certificate's key"

# 4. The statement: in-toto v1, and its one subject is this bundle.
[ "$(jq -r '._type' "$work/payload.json")" = https://in-toto.io/Statement/v1 ] || fail "not an in-toto v1 statement"
[ "$(jq '.subject | length' "$work/payload.json")" = 1 ] || fail "want exactly one subject"
want=$(jq -r '.subject[0].digest.sha256' "$work/payload.json")
got=$(sha256sum <"$bundle" | cut -d' ' -f1)
[ "$want" = "$got" ] || fail "$bundle has sha256 $got; the statement is about $want"

echo "verified: $bundle (sha256:$got) is the subject of a statement signed by $signer"
jq '.predicate' "$work/payload.json"
