/* A delaying TCP proxy for the benchmark: every byte takes a fixed extra time
 * each way, as if client and server were a round trip apart.
 *
 *     delayproxy TARGET_HOST TARGET_PORT DELAY_US
 *
 * Listens on a free port of 127.0.0.1 and prints it on stdout; forwards each
 * connection it accepts to TARGET_HOST:TARGET_PORT.  What is read from one
 * side is written to the other DELAY_US microseconds later (each direction:
 * the added round trip is twice that); a FIN is passed on after the data
 * before it, at the same delay.  SIGUSR1 prints one line of counters
 * ("accepted chunks_up chunks_down bytes_up bytes_down"); SIGTERM or SIGINT
 * prints it and exits.
 *
 * Why C: the bench forwards ~10,000 messages a second on a 2-core machine that
 * etcd and every client share; the same loop in Python (delayproxy.py) spends
 * 30-100 us of CPU per message, two to three times this one's, and would be
 * the wall.  This one is single-threaded: one epoll loop, one
 * timerfd.  Every chunk waits the same delay, so the chunks of all connections
 * are due in the order they were read: one FIFO, whose head sets the wait's
 * timeout (epoll_pwait2, nanoseconds; on kernels before 5.11 a timerfd, two
 * system calls more per chunk).  Connection set-up is not delayed (the kernel completes the
 * handshake): the clients keep their connections alive.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/timerfd.h>
#include <time.h>
#include <unistd.h>

#define READ_SIZE 65536
/* Stop reading a side while this many of its bytes are not yet written on. */
#define MAX_IN_FLIGHT (4 << 20)

struct link;

struct chunk {
    struct chunk *next;     /* in the delay FIFO, then in a side's out queue */
    struct link *link;
    int from;               /* the side it was read from: 0 client, 1 upstream */
    int eof;                /* a FIN, not data */
    uint64_t due;           /* CLOCK_MONOTONIC ns */
    size_t len, off;
    char data[];
};

struct side {
    int fd;
    int index;
    struct link *link;
    struct chunk *out_head, *out_tail;   /* due, to be written to this fd */
    unsigned events;                     /* registered with epoll */
    int read_eof, shut, throttled, flush_listed;
    struct side *flush_next;
};

struct link {
    struct side s[2];
    size_t in_flight[2];    /* bytes read from side i, not yet written to the other */
    int chunks;             /* chunks that point at this link */
    int dead;
    struct link *grave_next;
};

static int ep, timer_fd, signal_fd, listener;
static const char *target_host, *target_port;
static uint64_t delay_ns, armed_for;
static struct chunk *fifo_head, *fifo_tail;
static struct side *flush_list;
static struct link *graveyard;
static unsigned long long accepted, chunks_moved[2], bytes_moved[2];
static char tag_listener, tag_timer, tag_signal;

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void die(const char *what) {
    perror(what);
    exit(2);
}

/* side->events for a socket taken out of the epoll set: nothing more to do on it. */
#define GONE 0xffffffffu

static void watch(struct side *side, unsigned events) {
    if (side->events == events || side->events == GONE || side->fd < 0)
        return;
    struct epoll_event ev = {.events = events, .data.ptr = side};
    if (epoll_ctl(ep, EPOLL_CTL_MOD, side->fd, &ev) < 0)
        die("epoll_ctl");
    side->events = events;
}

static void want(struct side *side) {
    unsigned events = 0;
    if (!side->read_eof && !side->throttled)
        events |= EPOLLIN;
    if (side->out_head)
        events |= EPOLLOUT;
    watch(side, events);
}

static void free_chunk(struct chunk *c) {
    c->link->chunks--;
    free(c);
}

static void kill_link(struct link *link) {
    if (link->dead)
        return;
    link->dead = 1;
    for (int i = 0; i < 2; i++) {
        struct side *side = &link->s[i];
        while (side->out_head) {
            struct chunk *c = side->out_head;
            side->out_head = c->next;
            free_chunk(c);
        }
        if (side->fd >= 0)
            close(side->fd);   /* also leaves the epoll set */
        side->fd = -1;
    }
    link->grave_next = graveyard;
    graveyard = link;
}

static void finished_if_done(struct link *link) {
    for (int i = 0; i < 2; i++)
        if (!link->s[i].read_eof || !link->s[i].shut)
            return;
    kill_link(link);
}

static void flush(struct side *side) {
    struct link *link = side->link;
    struct side *source = &link->s[1 - side->index];
    while (side->out_head && !link->dead) {
        struct chunk *c = side->out_head;
        if (c->eof) {
            shutdown(side->fd, SHUT_WR);
            side->shut = 1;
        } else {
            ssize_t n = send(side->fd, c->data + c->off, c->len - c->off, MSG_NOSIGNAL);
            if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
                break;
            if (n < 0) {
                kill_link(link);
                return;
            }
            c->off += (size_t)n;
            link->in_flight[source->index] -= (size_t)n;
            if (c->off < c->len)
                continue;
        }
        side->out_head = c->next;
        free_chunk(c);
    }
    if (!side->out_head)
        side->out_tail = NULL;
    if (source->throttled && link->in_flight[source->index] < MAX_IN_FLIGHT / 2) {
        source->throttled = 0;
        want(source);
    }
    want(side);
    finished_if_done(link);
}

static void enqueue(struct link *link, int from, const char *data, size_t len, int eof) {
    struct chunk *c = malloc(sizeof *c + len);
    if (!c)
        die("malloc");
    c->next = NULL;
    c->link = link;
    c->from = from;
    c->eof = eof;
    c->due = now_ns() + delay_ns;
    c->len = len;
    c->off = 0;
    memcpy(c->data, data, len);
    link->chunks++;
    if (fifo_tail)
        fifo_tail->next = c;
    else
        fifo_head = c;
    fifo_tail = c;
}

static void read_side(struct side *side) {
    static char buffer[READ_SIZE];
    struct link *link = side->link;
    ssize_t n = recv(side->fd, buffer, sizeof buffer, 0);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
        return;
    if (n < 0) {
        kill_link(link);
        return;
    }
    if (n == 0) {
        side->read_eof = 1;
        enqueue(link, side->index, NULL, 0, 1);
    } else {
        enqueue(link, side->index, buffer, (size_t)n, 0);
        chunks_moved[side->index]++;
        bytes_moved[side->index] += (unsigned long long)n;
        link->in_flight[side->index] += (size_t)n;
        if (link->in_flight[side->index] > MAX_IN_FLIGHT)
            side->throttled = 1;
    }
    want(side);
}

static int connect_upstream(void) {
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *found;
    if (getaddrinfo(target_host, target_port, &hints, &found) != 0)
        return -1;
    int fd = -1;
    for (struct addrinfo *a = found; a; a = a->ai_next) {
        fd = socket(a->ai_family, a->ai_socktype, a->ai_protocol);
        if (fd >= 0 && connect(fd, a->ai_addr, a->ai_addrlen) == 0)
            break;
        if (fd >= 0)
            close(fd);
        fd = -1;
    }
    freeaddrinfo(found);
    return fd;
}

static void add_side(struct link *link, int i, int fd) {
    int one = 1;
    struct side *side = &link->s[i];
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (fcntl(fd, F_SETFL, O_NONBLOCK) < 0)
        die("fcntl");
    side->fd = fd;
    side->index = i;
    side->link = link;
    side->events = EPOLLIN;
    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = side};
    if (epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev) < 0)
        die("epoll_ctl");
}

static void accept_all(void) {
    for (;;) {
        int client = accept4(listener, NULL, NULL, SOCK_CLOEXEC);
        if (client < 0)
            return;   /* EAGAIN: all taken */
        int upstream = connect_upstream();
        if (upstream < 0) {
            close(client);
            continue;
        }
        struct link *link = calloc(1, sizeof *link);
        if (!link)
            die("calloc");
        add_side(link, 0, client);
        add_side(link, 1, upstream);
        accepted++;
    }
}

static void deliver_due(void) {
    uint64_t now = now_ns();
    while (fifo_head && fifo_head->due <= now) {
        struct chunk *c = fifo_head;
        fifo_head = c->next;
        if (!fifo_head)
            fifo_tail = NULL;
        c->next = NULL;
        if (c->link->dead) {
            free_chunk(c);
            continue;
        }
        struct side *to = &c->link->s[1 - c->from];
        if (to->out_tail)
            to->out_tail->next = c;
        else
            to->out_head = c;
        to->out_tail = c;
        if (!to->flush_listed) {
            to->flush_listed = 1;
            to->flush_next = flush_list;
            flush_list = to;
        }
    }
    while (flush_list) {
        struct side *side = flush_list;
        flush_list = side->flush_next;
        side->flush_listed = 0;
        if (!side->link->dead)
            flush(side);
    }
}

static void arm_timer(void) {
    uint64_t due = fifo_head ? fifo_head->due : 0;
    if (due == armed_for)
        return;
    struct itimerspec spec = {{0, 0}, {(time_t)(due / 1000000000u), (long)(due % 1000000000u)}};
    if (timerfd_settime(timer_fd, TFD_TIMER_ABSTIME, &spec, NULL) < 0)
        die("timerfd_settime");
    armed_for = due;
}

/* Wait for events until the FIFO's head is due. */
static int wait_events(struct epoll_event *events, int max) {
#ifdef SYS_epoll_pwait2
    static int no_pwait2;
    if (!no_pwait2) {
        struct timespec timeout, *until = NULL;
        if (fifo_head) {
            uint64_t now = now_ns(), left = fifo_head->due > now ? fifo_head->due - now : 0;
            timeout.tv_sec = (time_t)(left / 1000000000u);
            timeout.tv_nsec = (long)(left % 1000000000u);
            until = &timeout;
        }
        int n = (int)syscall(SYS_epoll_pwait2, ep, events, max, until, NULL, 0);
        if (n >= 0 || errno != ENOSYS)
            return n;
        no_pwait2 = 1;
    }
#endif
    arm_timer();
    return epoll_wait(ep, events, max, -1);
}

static void bury(void) {
    struct link **at = &graveyard;
    while (*at) {
        struct link *link = *at;
        if (link->chunks == 0) {
            *at = link->grave_next;
            free(link);
        } else {
            at = &link->grave_next;
        }
    }
}

static void report(void) {
    printf("%llu %llu %llu %llu %llu\n", accepted, chunks_moved[0], chunks_moved[1],
           bytes_moved[0], bytes_moved[1]);
    fflush(stdout);
}

static int on_signal(void) {
    struct signalfd_siginfo info;
    int stop = 0;
    while (read(signal_fd, &info, sizeof info) == sizeof info) {
        report();
        stop |= info.ssi_signo != SIGUSR1;
    }
    return stop;
}

static void add_fd(int fd, void *tag) {
    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = tag};
    if (epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev) < 0)
        die("epoll_ctl");
}

static void setup(void) {
    sigset_t signals;
    sigemptyset(&signals);
    sigaddset(&signals, SIGUSR1);
    sigaddset(&signals, SIGTERM);
    sigaddset(&signals, SIGINT);
    sigprocmask(SIG_BLOCK, &signals, NULL);
    signal(SIGPIPE, SIG_IGN);
    prctl(PR_SET_TIMERSLACK, 1UL);   /* wake at the due time, not 50 us later */
    ep = epoll_create1(EPOLL_CLOEXEC);
    timer_fd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
    signal_fd = signalfd(-1, &signals, SFD_NONBLOCK | SFD_CLOEXEC);
    listener = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (ep < 0 || timer_fd < 0 || signal_fd < 0 || listener < 0)
        die("setup");
    struct sockaddr_in address = {.sin_family = AF_INET,
                                  .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t size = sizeof address;
    if (bind(listener, (struct sockaddr *)&address, size) < 0 || listen(listener, 1024) < 0
            || getsockname(listener, (struct sockaddr *)&address, &size) < 0)
        die("listen");
    add_fd(listener, &tag_listener);
    add_fd(timer_fd, &tag_timer);
    add_fd(signal_fd, &tag_signal);
    printf("%d\n", ntohs(address.sin_port));
    fflush(stdout);
}

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: %s TARGET_HOST TARGET_PORT DELAY_US\n", argv[0]);
        return 2;
    }
    target_host = argv[1];
    target_port = argv[2];
    delay_ns = strtoull(argv[3], NULL, 10) * 1000u;
    setup();
    struct epoll_event events[256];
    for (;;) {
        int n = wait_events(events, 256);
        if (n < 0 && errno != EINTR)
            die("epoll_wait");
        for (int i = 0; i < n; i++) {
            void *tag = events[i].data.ptr;
            if (tag == &tag_listener) {
                accept_all();
            } else if (tag == &tag_timer) {
                uint64_t expirations;
                if (read(timer_fd, &expirations, sizeof expirations) < 0 && errno != EAGAIN)
                    die("timerfd");
                armed_for = 0;
            } else if (tag == &tag_signal) {
                if (on_signal())
                    return 0;
            } else {
                struct side *side = tag;
                if (side->link->dead)
                    continue;
                if (events[i].events & EPOLLERR) {
                    kill_link(side->link);
                } else if (events[i].events & EPOLLHUP && side->read_eof && side->shut) {
                    /* Both ways closed, the other side still busy: epoll would
                     * report this hang-up again and again. */
                    epoll_ctl(ep, EPOLL_CTL_DEL, side->fd, NULL);
                    side->events = GONE;
                    continue;
                }
                if (!side->link->dead && events[i].events & (EPOLLIN | EPOLLHUP)
                        && !side->read_eof)
                    read_side(side);
                if (!side->link->dead && events[i].events & EPOLLOUT)
                    flush(side);
            }
        }
        deliver_due();
        bury();
    }
}
