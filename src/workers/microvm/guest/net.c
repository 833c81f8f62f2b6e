/*
 * The guest's network, as a container's looks: loopback up; with `rollbox.net=A.B.C.D/N,GW`
 * on the kernel command line (network mode allowlist: QEMU has a virtio-net NIC on the
 * sandbox's tap), eth0 gets that address, a default route via GW, no IPv6, and the new
 * root's /etc/resolv.conf names GW (the platform's resolver on the host end of the veth).
 * Without it there is no NIC at all (mode none). Done by PID 1 before anything of the
 * sandbox runs; what root in the guest changes later only affects its own traffic, which
 * the host's rules filter whatever the guest configures.
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

static void set_addr(int s, unsigned long req, const char *ifname, in_addr_t addr) {
  struct ifreq ifr = {0};
  snprintf(ifr.ifr_name, sizeof ifr.ifr_name, "%s", ifname);
  struct sockaddr_in *sin = (struct sockaddr_in *)&ifr.ifr_addr;
  sin->sin_family = AF_INET;
  sin->sin_addr.s_addr = addr;
  if (ioctl(s, req, &ifr) < 0) vm_die(ifname);
}

static void write_file(const char *path, const char *text, int flags) {
  int fd = open(path, O_WRONLY | O_CLOEXEC | flags, 0644);
  if (fd < 0) vm_die(path);
  if (write(fd, text, strlen(text)) < 0) vm_die(path);
  close(fd);
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
  set_addr(s, SIOCSIFADDR, "eth0", addr.s_addr);
  set_addr(s, SIOCSIFNETMASK, "eth0", htonl(~0u << (32 - prefix)));
  set_flags_up(s, "eth0");
  struct rtentry rt = {0};
  struct sockaddr_in *dst = (struct sockaddr_in *)&rt.rt_dst, *via = (struct sockaddr_in *)&rt.rt_gateway, *mask = (struct sockaddr_in *)&rt.rt_genmask;
  dst->sin_family = via->sin_family = mask->sin_family = AF_INET;
  via->sin_addr = gateway;
  rt.rt_flags = RTF_UP | RTF_GATEWAY;
  rt.rt_dev = "eth0";
  if (ioctl(s, SIOCADDRT, &rt) < 0) vm_die("default route");
  close(s);
  /* The image's own resolv.conf (or a link in its place) is replaced: the platform's resolver only. */
  char text[80];
  snprintf(text, sizeof text, "nameserver %s\n", gw);
  mkdir("/newroot/etc", 0755);
  unlink("/newroot/etc/resolv.conf");
  write_file("/newroot/etc/resolv.conf", text, O_CREAT | O_EXCL | O_NOFOLLOW);
}
