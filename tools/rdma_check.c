/* tools/rdma_check.c - what NCCL will find on this node's RDMA side: every verbs device
 * (libibverbs), its ports (state, link layer InfiniBand or Ethernet = RoCE, speed, MTU), the GID
 * table of each port (RoCE v1/v2, IPv4-mapped addresses, the network interface a GID belongs
 * to), and the NCCL environment a cluster of such nodes needs: NCCL_IB_HCA, NCCL_IB_GID_INDEX,
 * NCCL_SOCKET_IFNAME (and NCCL_IB_DISABLE=1 where there is no usable device). Read-only: it opens
 * devices and queries them, it sends nothing. Exit code 0 when at least one port is active, 1
 * when none is (no RDMA devices, or all ports down), 2 on bad usage.
 * Usage: rdma_check [-v]   (-v: every GID, also the empty ones) */
#include <arpa/inet.h>
#include <endian.h>
#include <infiniband/verbs.h>
#include <stdio.h>
#include <string.h>

#define MAX_HCA 64

typedef struct pick {
    char hca[MAX_HCA][96]; /* "mlx5_0:1" entries of active ports */
    int n_hca;
    int gid_index;   /* the RoCE v2 IPv4 GID index seen first; -1 none */
    char ifname[64]; /* its network interface */
    int n_roce, n_ib;
} pick;

static const char *port_state(enum ibv_port_state s) {
    switch (s) {
    case IBV_PORT_ACTIVE:
        return "ACTIVE";
    case IBV_PORT_DOWN:
        return "DOWN";
    case IBV_PORT_INIT:
        return "INIT";
    case IBV_PORT_ARMED:
        return "ARMED";
    default:
        return "other";
    }
}

static double width_x(uint8_t w) {
    return w == 1 ? 1 : w == 2 ? 4 : w == 4 ? 8 : w == 8 ? 12 : w == 16 ? 2 : 0;
}

static double speed_gbps(uint32_t s) { /* per lane */
    switch (s) {
    case 1:
        return 2.5;
    case 2:
        return 5.0;
    case 4:
    case 8:
        return 10.0;
    case 16:
        return 14.0;
    case 32:
        return 25.0;
    case 64:
        return 50.0;
    case 128:
        return 100.0;
    case 256:
        return 200.0;
    default:
        return 0.0;
    }
}

/* The GID type and netdev from sysfs (ibv_query_gid_ex exists only in newer rdma-core). */
static void gid_sysfs(const char *dev, int port, int idx, char *type, size_t tn, char *nd,
                      size_t nn) {
    char path[256];
    type[0] = nd[0] = 0;
    snprintf(path, sizeof(path), "/sys/class/infiniband/%s/ports/%d/gid_attrs/types/%d", dev, port,
             idx);
    FILE *f = fopen(path, "r");
    if (f) {
        if (fgets(type, (int)tn, f))
            type[strcspn(type, "\n")] = 0;
        fclose(f);
    }
    snprintf(path, sizeof(path), "/sys/class/infiniband/%s/ports/%d/gid_attrs/ndevs/%d", dev, port,
             idx);
    f = fopen(path, "r");
    if (f) {
        if (fgets(nd, (int)nn, f))
            nd[strcspn(nd, "\n")] = 0;
        fclose(f);
    }
}

static void show_port(struct ibv_context *ctx, const char *dev, int port, int verbose, pick *p) {
    struct ibv_port_attr pa;
    if (ibv_query_port(ctx, (uint8_t)port, &pa) != 0) {
        printf("  port %d: ibv_query_port failed\n", port);
        return;
    }
    const int eth = pa.link_layer == IBV_LINK_LAYER_ETHERNET;
    printf("  port %d: %s, link layer %s, %gx %g Gb/s, active MTU %d, gid table %d%s\n", port,
           port_state(pa.state), eth ? "Ethernet (RoCE)" : "InfiniBand", width_x(pa.active_width),
           speed_gbps(pa.active_speed), 128 << pa.active_mtu, pa.gid_tbl_len, eth ? "" : "");
    if (!eth)
        printf("          LID %u, SM LID %u\n", pa.lid, pa.sm_lid);
    if (pa.state == IBV_PORT_ACTIVE && p->n_hca < MAX_HCA) {
        snprintf(p->hca[p->n_hca++], sizeof(p->hca[0]), "%s:%d", dev, port);
        if (eth)
            p->n_roce++;
        else
            p->n_ib++;
    }
    for (int i = 0; i < pa.gid_tbl_len; i++) {
        union ibv_gid g;
        if (ibv_query_gid(ctx, (uint8_t)port, i, &g) != 0)
            break;
        static const uint8_t zero[16];
        if (!verbose && !memcmp(g.raw, zero, 16))
            continue;
        char type[32], nd[64], txt[INET6_ADDRSTRLEN] = "";
        gid_sysfs(dev, port, i, type, sizeof(type), nd, sizeof(nd));
        // IPv4-mapped (::ffff:a.b.c.d) GIDs are the ones RoCE v2 routes over IPv4
        static const uint8_t v4pre[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
        const int v4 = !memcmp(g.raw, v4pre, 12);
        if (v4)
            inet_ntop(AF_INET, g.raw + 12, txt, sizeof(txt));
        else
            inet_ntop(AF_INET6, g.raw, txt, sizeof(txt));
        printf("    gid %3d: %-39s %-10s %s%s\n", i, txt, type[0] ? type : "?", nd[0] ? nd : "",
               v4 ? " (IPv4)" : "");
        if (eth && v4 && strstr(type, "v2") && p->gid_index < 0 && pa.state == IBV_PORT_ACTIVE) {
            p->gid_index = i;
            snprintf(p->ifname, sizeof(p->ifname), "%s", nd);
        }
    }
}

int main(int argc, char **argv) {
    int verbose = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-v")) {
            verbose = 1;
        } else {
            fprintf(stderr, "usage: rdma_check [-v]\n");
            return 2;
        }
    }
    int n = 0;
    struct ibv_device **devs = ibv_get_device_list(&n);
    if (!devs || n == 0) {
        printf("no RDMA devices (libibverbs found none: no InfiniBand/RoCE NIC, or its driver "
               "and rdma-core provider are not installed)\n");
        printf(
            "\nNCCL settings for this node:\n"
            "  export NCCL_IB_DISABLE=1          # no verbs devices: NCCL uses TCP sockets\n"
            "  export NCCL_SOCKET_IFNAME=<nic>   # the interface the nodes reach each other on\n");
        if (devs)
            ibv_free_device_list(devs);
        return 1;
    }
    pick p = {.gid_index = -1};
    for (int d = 0; d < n; d++) {
        const char *name = ibv_get_device_name(devs[d]);
        struct ibv_context *ctx = ibv_open_device(devs[d]);
        if (!ctx) {
            printf("device %s: cannot open (permissions on /dev/infiniband?)\n", name);
            continue;
        }
        struct ibv_device_attr da;
        if (ibv_query_device(ctx, &da) != 0) {
            printf("device %s: ibv_query_device failed\n", name);
            ibv_close_device(ctx);
            continue;
        }
        printf("device %s: %d port(s), fw %s, node guid %016llx, max QPs %d, max MR size %llu\n",
               name, da.phys_port_cnt, da.fw_ver,
               (unsigned long long)be64toh(ibv_get_device_guid(devs[d])), da.max_qp,
               (unsigned long long)da.max_mr_size);
        for (int port = 1; port <= da.phys_port_cnt; port++)
            show_port(ctx, name, port, verbose, &p);
        ibv_close_device(ctx);
    }
    ibv_free_device_list(devs);

    printf("\nNCCL settings for this node:\n");
    if (p.n_hca == 0) {
        printf("  no ACTIVE port: check cables, the subnet manager (InfiniBand) or the switch "
               "(RoCE)\n  export NCCL_IB_DISABLE=1   # until then NCCL can only use TCP\n");
        return 1;
    }
    printf("  export NCCL_IB_HCA=");
    for (int i = 0; i < p.n_hca; i++)
        printf("%s%s", i ? "," : "", p.hca[i]);
    printf("\n");
    if (p.n_roce) {
        if (p.gid_index >= 0) {
            printf("  export NCCL_IB_GID_INDEX=%d   # RoCE v2 over IPv4 on %s\n", p.gid_index,
                   p.ifname[0] ? p.ifname : "?");
            if (p.ifname[0])
                printf("  export NCCL_SOCKET_IFNAME=%s   # bootstrap + tokenmill's rendezvous on "
                       "the same network\n",
                       p.ifname);
        } else {
            printf("  # no RoCE v2 IPv4 GID on an active port: give the NIC an IPv4 address, or "
                   "set NCCL_IB_GID_INDEX by hand\n");
        }
        printf("  # RoCE needs a lossless fabric (PFC/ECN) and the same GID index on every "
               "node;\n  # with a traffic class for RDMA set NCCL_IB_TC (e.g. 106) as the "
               "network team says\n");
    } else {
        printf("  export NCCL_SOCKET_IFNAME=<ipoib or ethernet interface>   # for bootstrap\n");
    }
    return 0;
}
