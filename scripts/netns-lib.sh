# Shared by the network-namespace scripts (source it; it runs nothing by itself).

# add_host NS HOST_IF SWITCH_IF SWITCH_NS BRIDGE ADDR: an emulated host. Creates namespace NS
# with an `eth0` (a veth made as HOST_IF) holding ADDR (cidr) and loopback up, and attaches
# the veth's other end (SWITCH_IF) to BRIDGE in SWITCH_NS.
add_host() {
    local ns=$1 host_if=$2 switch_if=$3 switch_ns=$4 bridge=$5 addr=$6
    ip netns add "$ns"
    ip link add "$host_if" type veth peer name "$switch_if"
    ip link set "$host_if" netns "$ns"
    ip link set "$switch_if" netns "$switch_ns"
    ip -n "$ns" link set "$host_if" name eth0
    ip -n "$ns" addr add "$addr" dev eth0
    ip -n "$ns" link set eth0 up
    ip -n "$ns" link set lo up
    ip -n "$switch_ns" link set "$switch_if" master "$bridge" up
}

# add_star PREFIX SWITCH_NS COUNT SUBNET: COUNT emulated hosts PREFIX0 … on one bridge `br0`
# in a new SWITCH_NS, host h at SUBNET<h + 1>/24 (SUBNET like `198.18.5.`), its veth made as
# PREFIXe<h> and attached as PREFIXp<h>.
add_star() {
    local prefix=$1 sw=$2 count=$3 subnet=$4 h
    ip netns add "$sw"
    ip -n "$sw" link add br0 type bridge
    ip -n "$sw" link set br0 up
    for h in $(seq 0 $((count - 1))); do
        add_host "$prefix$h" "${prefix}e$h" "${prefix}p$h" "$sw" br0 "$subnet$((h + 1))/24"
    done
}

# del_star PREFIX SWITCH_NS COUNT: removes what add_star made, quietly (for cleanups, and
# before building in case an earlier run was killed).
del_star() {
    local prefix=$1 sw=$2 count=$3 h
    for h in $(seq 0 $((count - 1))); do ip netns del "$prefix$h" 2>/dev/null || true; done
    ip netns del "$sw" 2>/dev/null || true
}
