#!/usr/bin/env bash
# `make e2e-kind`: Kube-Ferry installed from its image and manifests on three kind clusters (a compute
# cluster and two tenants), then the e2e suite against them. Needs docker, kind and kubectl on the PATH.
# KEEP=1 leaves the clusters up; GPUS (default 8) is what each compute worker advertises.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
WORK=$ROOT/build/e2e-kind
PY=${PY:-$ROOT/.venv/bin/python}
GPUS=${GPUS:-8}
TAG=$($PY -c 'import ferry; print(ferry.__version__)')
TENANTS=(tenant-1 tenant-2)

for tool in docker kind kubectl skopeo openssl; do
  command -v "$tool" >/dev/null || { echo "e2e-kind: $tool is not on the PATH (install it first)" >&2; exit 2; }
done
step() { echo "== $*" >&2; }
mkdir -p "$WORK"

step "image kube-ferry:$TAG (make image) and a docker archive of it"
make -C "$ROOT" image
skopeo copy --quiet "oci:$ROOT/build/image/oci:$TAG" "docker-archive:$WORK/kube-ferry.tar:kube-ferry:$TAG"

step "clusters"
kind get clusters 2>/dev/null | grep -qx ferry-compute || kind create cluster --config e2e/kind/compute.yaml
for t in "${TENANTS[@]}"; do
  kind get clusters 2>/dev/null | grep -qx "ferry-$t" || kind create cluster --name "ferry-$t" --config e2e/kind/tenant.yaml
done
for c in ferry-compute "${TENANTS[@]/#/ferry-}"; do
  kind load image-archive "$WORK/kube-ferry.tar" --name "$c"
  kind get kubeconfig --name "$c" > "$WORK/$c.kubeconfig"
done
C="kubectl --kubeconfig $WORK/ferry-compute.kubeconfig"

step "compute cluster: advertise $GPUS GPUs per worker"
for node in $($C get nodes -l '!node-role.kubernetes.io/control-plane' -o name); do
  $C patch "$node" --subresource=status --type=merge -p "{\"status\":{\"capacity\":{\"nvidia.com/gpu\":\"$GPUS\"}}}"
done

step "compute cluster: CRDs, scheduler, tenants' namespaces and Queues"
$C apply --server-side -k manifests/crds
$C wait --for=condition=Established --timeout=60s crd/queues.scheduling.kubeferry.io crd/podgroups.scheduling.kubeferry.io
mkdir -p "$WORK/compute"
cat > "$WORK/compute/kustomization.yaml" <<YAML
resources: [../../../manifests/compute]
images: [{name: kube-ferry, newName: kube-ferry, newTag: "$TAG"}]
YAML
$C apply --server-side -k "$WORK/compute"
$C -n kube-ferry-system rollout status deployment/kube-ferry-scheduler --timeout=180s
$C -n kube-ferry-system rollout status deployment/kube-ferry-dns --timeout=180s
DNS=$($C -n kube-ferry-system get service kube-ferry-dns -o jsonpath='{.spec.clusterIP}')

SERVER=$(kind get kubeconfig --internal --name ferry-compute | sed -n 's/^ *server: //p')
CA=$(kind get kubeconfig --internal --name ferry-compute | sed -n 's/^ *certificate-authority-data: //p')
for t in "${TENANTS[@]}"; do
  step "$t: its compute namespace, Queue and vnode credentials; the vnode in its own cluster"
  sed "s/\${TENANT}/$t/g" manifests/tenant-template.yaml | $C apply --server-side -f -
  TOKEN=$($C -n "$t" create token kube-ferry-vnode --duration=24h)
  cat > "$WORK/$t-compute.kubeconfig" <<YAML
apiVersion: v1
kind: Config
clusters: [{name: compute, cluster: {server: "$SERVER", certificate-authority-data: "$CA"}}]
users: [{name: vnode, user: {token: "$TOKEN"}}]
contexts: [{name: compute, context: {cluster: compute, user: vnode, namespace: "$t"}}]
current-context: compute
YAML
  T="kubectl --kubeconfig $WORK/ferry-$t.kubeconfig"
  # the tenant apiserver as compute pods reach it: its container on kind's network (a name its certificate has)
  TENANT_API=$(kind get kubeconfig --internal --name "ferry-$t" | sed -n 's#^ *server: https://##p')
  mkdir -p "$WORK/$t"
  docker exec "ferry-$t-control-plane" cat /etc/kubernetes/pki/ca.crt > "$WORK/$t/client-ca.crt"
  openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj "/CN=ferry-$t" \
    -keyout "$WORK/$t/vnode.key" -out "$WORK/$t/vnode.crt" 2>/dev/null
  $T create namespace kube-ferry-system --dry-run=client -o yaml | $T apply -f -
  $T -n kube-ferry-system create secret generic kube-ferry-compute \
    --from-file=kubeconfig="$WORK/$t-compute.kubeconfig" --dry-run=client -o yaml | $T apply -f -
  $T -n kube-ferry-system create secret tls kube-ferry-vnode-serving \
    --cert="$WORK/$t/vnode.crt" --key="$WORK/$t/vnode.key" --dry-run=client -o yaml | $T apply -f -
  cat > "$WORK/$t/kustomization.yaml" <<YAML
resources: [../../../manifests/tenant]
images: [{name: kube-ferry, newName: kube-ferry, newTag: "$TAG"}]
configMapGenerator:
- name: kube-ferry-vnode
  namespace: kube-ferry-system
  behavior: replace
  options: {disableNameSuffixHash: true}
  literals: [tenant=$t, dns-server=$DNS, tenant-api=$TENANT_API]
  files: [client-ca.crt]
YAML
  $T apply --server-side -k "$WORK/$t"
  $T wait --for=condition=Ready "node/ferry-$t" --timeout=180s
done

step "e2e suite"
FERRY_E2E_COMPUTE="$WORK/ferry-compute.kubeconfig" \
FERRY_E2E_TENANTS="tenant-1=$WORK/ferry-tenant-1.kubeconfig,tenant-2=$WORK/ferry-tenant-2.kubeconfig" \
  "$PY" -m pytest -q -ra e2e && status=0 || status=$?
if [ "${KEEP:-0}" != 1 ]; then
  for c in ferry-compute "${TENANTS[@]/#/ferry-}"; do kind delete cluster --name "$c"; done
fi
exit $status
