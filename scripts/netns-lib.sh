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
