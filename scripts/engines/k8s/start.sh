#!/usr/bin/env bash
# Start a one-node Kubernetes test cluster: etcd, kube-apiserver, kube-scheduler,
# kube-controller-manager, a dockerd of its own and a kubelet (dockershim), all inside a
# network namespace made for it. The node's address is the namespace end of a veth
# pair with self-made addresses (10.213.N.2/30; the host end, 10.213.N.1, is where the
# tests listen for their jobs). Nothing binds outside the namespace.
#
# Usage: start.sh            -> prints KEY=VALUE lines (STATE=<dir>, KUBECONFIG=..., ...)
# Stop with: stop.sh <STATE dir>
set -euo pipefail

HERE="$(cd "$(dirname "$0")" && pwd)"
VERSION="${FIBER_K8S_VERSION:-1.20.2}"
bash "$HERE/build.sh" >&2
BIN="${FIBER_CACHE_DIR:-/var/cache/fiber}/k8s/$VERSION/bin"

ID="$(head -c4 /dev/urandom | od -An -tx1 | tr -d ' \n')"
STATE="/tmp/fk8s.$ID"
mkdir -m 0700 "$STATE"
cd "$STATE"
mkdir -p pids logs etcd pki kubelet docker x cni
echo "$ID" > id
echo "STATE=$STATE"
# on any failure: tear down what was started so far
trap 'status=$?; if (( status != 0 )); then log "start failed; stopping"; bash "$HERE/stop.sh" "$STATE"; fi' EXIT
NETNS="fk8s-$ID"
echo "$NETNS" > netns
NODE=fiber-node
log() { echo "[k8s $(date +%T)] $*" >&2; }

# -- network: a namespace and a veth pair on an unused 10.213.N.0/30 -----------------
ip netns add "$NETNS"
for n in $(shuf -i 1-250); do
    if ! ip -o addr | grep -q -e " 10\.213\.$n\." -e " 10\.214\.$n\." && ! ip route | grep -q -e "^10\.213\.$n\." -e "^10\.214\.$n\."; then
        SUBNET=$n; break
    fi
done
HOST_IP="10.213.$SUBNET.1"
NODE_IP="10.213.$SUBNET.2"
HOST_IF="fk8s$ID"  # <= 15 characters
ip link add "$HOST_IF" type veth peer name eth-node netns "$NETNS"
echo "$HOST_IF" > veth
ip addr add "$HOST_IP/30" dev "$HOST_IF"
ip link set "$HOST_IF" up
ip -n "$NETNS" link set lo up
ip -n "$NETNS" addr add "$NODE_IP/30" dev eth-node
ip -n "$NETNS" link set eth-node up
# pods that do not use hostNetwork get 10.214.N.0/24 on a bridge in the namespace
# (CNI bridge plugin); the host routes that range to the namespace end of the veth
POD_CIDR="10.214.$SUBNET.0/24"
ip netns exec "$NETNS" sysctl -q -w net.ipv4.ip_forward=1
ip route add "$POD_CIDR" via "$NODE_IP" dev "$HOST_IF"
cat > cni/10-fiber-pods.conflist <<CNI
{"cniVersion": "0.4.0", "name": "fiber-pods", "plugins": [
  {"type": "bridge", "bridge": "fk8s0", "isGateway": true, "ipMasq": false,
   "hairpinMode": true,
   "ipam": {"type": "host-local", "subnet": "$POD_CIDR", "dataDir": "$STATE/cni-ipam",
            "routes": [{"dst": "10.213.$SUBNET.0/30"}]}}
]}
CNI
in_ns() { nsenter --net="/var/run/netns/$NETNS" "$@"; }

start_time() {  # start_time PID: the process's start time (field 22 of /proc/PID/stat)
    local stat
    stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
    stat=${stat##*) }
    # shellcheck disable=SC2086
    set -- $stat
    echo "${20}"
}
spawn() {  # spawn NAME CMD...: run in the namespace, detached, "PID STARTTIME" recorded
    local name=$1 pid; shift
    # exec, so that the recorded pid is the server itself: setsid does not fork (the
    # subshell is no process group leader) and nsenter execs the command
    ( exec setsid nsenter --net="/var/run/netns/$NETNS" "$@" >"logs/$name.log" 2>&1 </dev/null ) &
    pid=$!
    echo "$pid $(start_time "$pid")" > "pids/$name"
}

wait_for() {  # wait_for SECONDS WHAT CMD...
    local limit=$1 what=$2; shift 2
    for _ in $(seq $((limit * 5))); do
        if "$@" >/dev/null 2>&1; then return 0; fi
        sleep 0.2
    done
    log "timed out waiting for $what; logs in $STATE/logs"
    return 1
}

# -- credentials ---------------------------------------------------------------------
openssl req -x509 -newkey rsa:2048 -nodes -days 30 -subj "/CN=fiber-k8s-test" \
    -keyout pki/apiserver.key -out pki/apiserver.crt \
    -addext "subjectAltName=IP:$NODE_IP,IP:127.0.0.1,IP:10.0.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc" \
    -addext "basicConstraints=critical,CA:TRUE" 2>/dev/null
openssl genrsa -out pki/sa.key 2048 2>/dev/null
openssl rsa -in pki/sa.key -pubout -out pki/sa.pub 2>/dev/null
tok() { head -c16 /dev/urandom | od -An -tx1 | tr -d ' \n'; }
ADMIN_TOKEN=$(tok); NODE_TOKEN=$(tok); NOBODY_TOKEN=$(tok)
cat > pki/tokens.csv <<TOKENS
$ADMIN_TOKEN,admin,admin,"system:masters"
$NODE_TOKEN,system:node:$NODE,node,"system:nodes,system:masters"
$NOBODY_TOKEN,fiber-nobody,nobody
TOKENS
kubeconfig() {  # kubeconfig FILE USER TOKEN
    local ca
    ca=$(base64 -w0 pki/apiserver.crt)
    cat > "$1" <<KC
apiVersion: v1
kind: Config
clusters:
- name: fiber-test
  cluster: {server: "https://$NODE_IP:6443", certificate-authority-data: $ca}
users:
- name: $2
  user: {token: $3}
contexts:
- name: $2
  context: {cluster: fiber-test, user: $2, namespace: default}
current-context: $2
KC
}
kubeconfig admin.kubeconfig admin "$ADMIN_TOKEN"
kubeconfig node.kubeconfig node "$NODE_TOKEN"
kubeconfig nobody.kubeconfig fiber-nobody "$NOBODY_TOKEN"
chmod 600 ./*.kubeconfig

# -- control plane -----------------------------------------------------------------------
START=$(date +%s)
spawn etcd etcd --name fk8s --data-dir "$STATE/etcd" \
    --listen-client-urls http://127.0.0.1:2379 --advertise-client-urls http://127.0.0.1:2379 \
    --listen-peer-urls http://127.0.0.1:2380 --initial-advertise-peer-urls http://127.0.0.1:2380 \
    --initial-cluster fk8s=http://127.0.0.1:2380 --listen-metrics-urls http://127.0.0.1:2381
wait_for 30 etcd in_ns bash -c "exec 3<>/dev/tcp/127.0.0.1/2379"

spawn apiserver "$BIN/kube-apiserver" \
    --etcd-servers=http://127.0.0.1:2379 \
    --bind-address="$NODE_IP" --secure-port=6443 --insecure-port=0 --advertise-address="$NODE_IP" \
    --tls-cert-file="$STATE/pki/apiserver.crt" --tls-private-key-file="$STATE/pki/apiserver.key" \
    --token-auth-file="$STATE/pki/tokens.csv" --authorization-mode=Node,RBAC \
    --service-account-key-file="$STATE/pki/sa.pub" --service-account-signing-key-file="$STATE/pki/sa.key" \
    --service-account-issuer=https://kubernetes.default.svc \
    --service-cluster-ip-range=10.0.0.0/24 --allow-privileged=true \
    --enable-priority-and-fairness=false --profiling=false \
    --kubelet-preferred-address-types=InternalIP
KUBECTL_CURL=(curl -sk --max-time 2 -H "Authorization: Bearer $ADMIN_TOKEN")
wait_for 60 "kube-apiserver" "${KUBECTL_CURL[@]}" -f "https://$NODE_IP:6443/readyz"
log "apiserver ready after $(( $(date +%s) - START )) s"

spawn scheduler "$BIN/kube-scheduler" --kubeconfig="$STATE/admin.kubeconfig" --leader-elect=false \
    --bind-address=127.0.0.1 --secure-port=10259 --port=0
spawn controller-manager "$BIN/kube-controller-manager" --kubeconfig="$STATE/admin.kubeconfig" \
    --leader-elect=false --bind-address=127.0.0.1 --secure-port=10257 --port=0 \
    --service-account-private-key-file="$STATE/pki/sa.key" --root-ca-file="$STATE/pki/apiserver.crt" \
    --controllers='*,-nodeipam,-cloud-node-lifecycle,-service,-route'

# -- docker (own instance) with a runtime that clamps negative oomScoreAdj ------------
cat > runc-clamp <<'WRAP'
#!/bin/sh
# runc, but a negative oomScoreAdj (which this host's root may not set) becomes 0.
prev=""; bundle=""
for a in "$@"; do
    case "$prev" in --bundle|-b) bundle="$a" ;; esac
    case "$a" in --bundle=*) bundle="${a#--bundle=}" ;; esac
    prev="$a"
done
if [ -n "$bundle" ] && [ -f "$bundle/config.json" ]; then
    jq -c 'if (.process.oomScoreAdj // 0) < 0 then .process.oomScoreAdj = 0 else . end' \
        "$bundle/config.json" > "$bundle/config.json.clamp" \
        && mv "$bundle/config.json.clamp" "$bundle/config.json"
fi
exec runc "$@"
WRAP
chmod +x runc-clamp
spawn dockerd dockerd --bridge=none --iptables=false --ip-masq=false --ip-forward=false \
    --data-root "$STATE/docker" --exec-root "$STATE/x" --host "unix://$STATE/docker.sock" \
    --pidfile "$STATE/docker.pid" --add-runtime "fk8s=$STATE/runc-clamp" \
    --default-runtime fk8s --cgroup-parent "fk8s-$ID" --log-driver json-file
export DOCKER_HOST="unix://$STATE/docker.sock"
wait_for 60 dockerd docker version
echo "DOCKER_READY=$DOCKER_HOST"  # the engine imports its test image meanwhile
tar -C "$BIN" -cf - pause | docker import -c 'ENTRYPOINT ["/pause"]' - fiber-k8s/pause:3.2 >/dev/null

# -- kubelet -------------------------------------------------------------------------
spawn kubelet "$BIN/kubelet" --kubeconfig="$STATE/node.kubeconfig" --hostname-override="$NODE" \
    --node-ip="$NODE_IP" --address="$NODE_IP" --port=10250 --read-only-port=0 \
    --healthz-bind-address=127.0.0.1 --root-dir="$STATE/kubelet" --cert-dir="$STATE/pki/kubelet" \
    --container-runtime=docker --docker-endpoint="unix://$STATE/docker.sock" \
    --pod-infra-container-image=fiber-k8s/pause:3.2 --cgroup-driver=cgroupfs \
    --cgroups-per-qos=false --enforce-node-allocatable= --fail-swap-on=false \
    --eviction-hard='memory.available<1Mi,nodefs.available<1%,imagefs.available<1%' \
    --image-gc-high-threshold=100 --image-gc-low-threshold=99 \
    --network-plugin=cni --cni-bin-dir=/usr/lib/cni --cni-conf-dir="$STATE/cni" \
    --cni-cache-dir="$STATE/cni-cache" --volume-plugin-dir="$STATE/volume-plugins" \
    --container-runtime-endpoint="unix://$STATE/dockershim.sock" \
    --image-service-endpoint="unix://$STATE/dockershim.sock" \
    --experimental-dockershim-root-directory="$STATE/dockershim" \
    --seccomp-profile-root="$STATE/kubelet/seccomp" \
    --resolv-conf=/etc/resolv.conf --cluster-domain=cluster.local \
    --register-node=true --node-status-update-frequency=2s --sync-frequency=5s \
    --kube-api-qps=50 --kube-api-burst=100 --event-qps=0 \
    --authentication-token-webhook=false --anonymous-auth=true --authorization-mode=AlwaysAllow
node_ready() {
    "${KUBECTL_CURL[@]}" "https://$NODE_IP:6443/api/v1/nodes/$NODE" \
        | jq -e '.status.conditions[] | select(.type=="Ready") | .status == "True"' | grep -q true
}
sa_ready() { "${KUBECTL_CURL[@]}" -f "https://$NODE_IP:6443/api/v1/namespaces/default/serviceaccounts/default"; }
wait_for 120 "node Ready" node_ready
wait_for 60 "default service account" sa_ready
log "node Ready after $(( $(date +%s) - START )) s"

cat <<OUT
KUBECONFIG=$STATE/admin.kubeconfig
NOBODY_KUBECONFIG=$STATE/nobody.kubeconfig
DOCKER_HOST=unix://$STATE/docker.sock
HOST_IP=$HOST_IP
NODE_IP=$NODE_IP
NETNS=$NETNS
POD_CIDR=$POD_CIDR
OUT
