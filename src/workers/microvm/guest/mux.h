/* The multiplexer's channels, shared by mux.c (frames, the init's connections) and requests.c. */
#ifndef ROLLBOX_MUX_H
#define ROLLBOX_MUX_H

#include "vminit.h"
#include <sys/types.h>

struct chan {
  uint32_t id;
  int fd;           /* connection to the init, -1 once closed */
  char *pend;       /* bytes from the host not yet written to the init */
  size_t pend_len;
  int host_eof;     /* the host half-closed: shut down our write side once pend is out */
  int init_eof;     /* the init half-closed */
  int req;          /* a request (MUX_SNAPSHOT, ...) whose body is still arriving in pend; 0 otherwise */
  pid_t job;        /* a snapshot's child, fd its SOCK_SEQPACKET socket; 0 otherwise */
  int job_freezes;  /* the job freezes the sandbox: thawed here should it end without its result */
  int job_done;     /* its result came */
};

extern struct chan *chans[MUX_MAX_CHANNELS];
extern int nchans;

void put32(char *p, uint32_t v);
uint32_t get32(const char *p);
/* A frame for the host, written to the port as it drains. */
void queue(uint32_t id, int kind, const char *payload, size_t len);
struct chan *chan_of(uint32_t id);
/* Ends a channel here (a request's child killed and, if it froze the sandbox, thawed). */
void chan_free(struct chan *c);

/* requests.c */
void req_open(uint32_t id, int kind);
/* A frame of a request whose body is still arriving: DATA gathered, EOF runs it, CLOSE drops it. */
void req_frame(struct chan *c, int kind, const char *p, size_t len);
/* A record of a snapshot's child on its channel (c->job). */
void read_job(struct chan *c);

#endif
