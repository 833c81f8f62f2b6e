/*
 * The guest's network, as a container's looks: loopback up; with `rollbox.net=A.B.C.D/N,GW`
 * on the kernel command line (network mode allowlist: QEMU has a virtio-net NIC on the
 * sandbox's tap), eth0 gets that address, a default route via GW, no IPv6, and the new
 * root's /etc/resolv.conf names GW (the platform's resolver on the host end of the veth).
 * Without it there is no NIC at all (mode none). Done by PID 1 before anything of the
 * sandbox runs; what root in the guest changes later only affects its own traffic, which
 * the host's rules filter whatever the guest configures. After a wake (possibly on
 * another host) the multiplexer applies the new lease the same way (vm_net_reconfigure).
 */
#define _GNU_SOURCE
#include "vminit.h"
#include <arpa/inet.h>
#include <fcntl.h>
#include <net/if.h>
#include <net/route.h>
#include <netinet/in.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/socket.h>
#include <time.h>

static void set_flags_up(int s, const char *ifname) {
  struct ifreq ifr = {0};
  snprintf(ifr.ifr_name, sizeof ifr.ifr_name, "%s", ifname);
  if (ioctl(s, SIOCGIFFLAGS, &ifr) < 0) vm_die(ifname);
  ifr.ifr_flags |= IFF_UP;
  if (ioctl(s, SIOCSIFFLAGS, &ifr) < 0) vm_die(ifname);
}

static void write_file(const char *path, const char *text, int flags) {
  int fd = open(path, O_WRONLY | O_CLOEXEC | flags, 0644);
  if (fd < 0) vm_die(path);
  if (write(fd, text, strlen(text)) < 0) vm_die(path);
  close(fd);
}

/* eth0 at ADDR/PREFIX with its default route via GW, replacing what it had (an address of before a wake). */
static int apply_address(int s, struct in_addr addr, int prefix, struct in_addr gateway) {
  struct rtentry rt = {0};
  struct sockaddr_in *dst = (struct sockaddr_in *)&rt.rt_dst, *via = (struct sockaddr_in *)&rt.rt_gateway, *mask = (struct sockaddr_in *)&rt.rt_genmask;
  dst->sin_family = via->sin_family = mask->sin_family = AF_INET;
  rt.rt_dev = "eth0";
  /* The default route of before (none at boot): its gateway is another host's veth now. */
  if (ioctl(s, SIOCDELRT, &rt) < 0 && errno != ESRCH) return errno;
  struct ifreq ifr = {0};
  snprintf(ifr.ifr_name, sizeof ifr.ifr_name, "eth0");
  struct sockaddr_in *sin = (struct sockaddr_in *)&ifr.ifr_addr;
  sin->sin_family = AF_INET;
  sin->sin_addr = addr;
  if (ioctl(s, SIOCSIFADDR, &ifr) < 0) return errno;
  sin->sin_addr.s_addr = htonl(~0u << (32 - prefix));
  if (ioctl(s, SIOCSIFNETMASK, &ifr) < 0) return errno;
  if (ioctl(s, SIOCGIFFLAGS, &ifr) < 0) return errno;
  ifr.ifr_flags |= IFF_UP;
  if (ioctl(s, SIOCSIFFLAGS, &ifr) < 0) return errno;
  via->sin_addr = gateway;
  rt.rt_flags = RTF_UP | RTF_GATEWAY;
  if (ioctl(s, SIOCADDRT, &rt) < 0 && errno != EEXIST) return errno;
  return 0;
}

/* `nameserver GW` as the only content of etc/resolv.conf under the directory `etc`: the
 * file is replaced, never followed (a link the sandbox put there stays unused). */
static int write_resolver(int etc, struct in_addr gateway) {
  char text[80];
  snprintf(text, sizeof text, "nameserver %s\n", inet_ntoa(gateway));
  unlinkat(etc, "resolv.conf", 0);
  int fd = openat(etc, "resolv.conf", O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd < 0) return errno;
  int err = write(fd, text, strlen(text)) < 0 ? errno : 0;
  close(fd);
  return err;
}

void vm_net_setup(void) {
  int s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (s < 0) vm_die("socket");
  set_flags_up(s, "lo");
  char spec[64];
  vm_cmdline_str("rollbox.net", spec, sizeof spec);
  if (!spec[0]) {
    close(s);
    return;
  }
  char *gw = strchr(spec, ',');
  char *slash = strchr(spec, '/');
  if (!gw || !slash || slash > gw) {
    errno = EINVAL;
    vm_die("rollbox.net");
  }
  *gw++ = 0;
  *slash = 0;
  int prefix = atoi(slash + 1);
  struct in_addr addr, gateway;
  if (prefix < 1 || prefix > 31 || !inet_aton(spec, &addr) || !inet_aton(gw, &gateway)) {
    errno = EINVAL;
    vm_die("rollbox.net");
  }
  /* virtio_net was loaded with the other modules; its device may still be probing. */
  for (int tries = 0; if_nametoindex("eth0") == 0; tries++) {
    if (tries >= 500) vm_die("eth0");
    struct timespec t = {0, 10 * 1000 * 1000};
    nanosleep(&t, NULL);
  }
  write_file("/proc/sys/net/ipv6/conf/eth0/disable_ipv6", "1\n", 0);
  if ((errno = apply_address(s, addr, prefix, gateway))) vm_die("eth0 address");
  close(s);
  /* The image's own resolv.conf (or a link in its place) is replaced: the platform's resolver only. */
  mkdir("/newroot/etc", 0755);
  int etc = open("/newroot/etc", O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (etc < 0 || (errno = write_resolver(etc, gateway))) vm_die("/newroot/etc/resolv.conf");
  close(etc);
}

/*
 * MUX_NET after a wake (the multiplexer, which kept every capability, applies it before
 * any command): the lease of the host that woke the VM, so eth0's address, the default
 * route and the resolver change; connections of before the save break. The new root is
 * reached through the init's root (/proc/1/root: this process stays in the initramfs),
 * its etc/ never followed through a link. 0, or the errno of what failed.
 */
int vm_net_reconfigure(const char *p, size_t len) {
  if (len != MUX_NET_PAYLOAD_BYTES) return EINVAL;
  struct in_addr addr, gateway;
  memcpy(&addr.s_addr, p, 4);
  memcpy(&gateway.s_addr, p + 8, 4);
  int prefix = (unsigned char)p[4];
  if (prefix < 1 || prefix > 31) return EINVAL;
  int s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (s < 0) return errno;
  int err = if_nametoindex("eth0") ? apply_address(s, addr, prefix, gateway) : ENODEV;
  close(s);
  if (err) return err;
  /* The sandbox's own /etc: a resolver it cannot get is its own doing (it removed /etc), not the wake's failure. */
  int root = open("/proc/1/root", O_PATH | O_DIRECTORY | O_CLOEXEC);
  int etc = root < 0 ? -1 : openat(root, "etc", O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  int werr = etc < 0 ? errno : write_resolver(etc, gateway);
  if (werr) vm_log("resolv.conf after a wake: %s", strerror(werr));
  if (etc >= 0) close(etc);
  if (root >= 0) close(root);
  return 0;
}
