/*
 * grpcload: a closed-loop load generator for gRPC unary calls over h2c.
 *
 * Why C: the generator must cost far less CPU than the servers it measures,
 * or on a small machine it steals the cores it is meant to leave to them.
 * One thread, epoll, nonblocking sockets and libnghttp2's framing keep it to
 * a few percent of one core at tens of thousands of calls per second.
 *
 * It keeps exactly --inflight requests outstanding, spread round robin over
 * --connections connections (several connections let SO_REUSEPORT spread
 * them over server processes). Every request is the --body template with a
 * fresh unique id written over the --id-length bytes at --id-offset, because
 * servers may refuse a reused id (Warden's Begin does). A response counts as
 * a success only with HTTP 200 and the trailer grpc-status: 0.
 *
 * After --warmup seconds it prints "start" on stdout, measures for
 * --duration seconds, prints "end", lets the calls in flight finish, and
 * prints one JSON line: requests, errors, duration, rps, latency
 * percentiles in ms and its own CPU time over the measured window. The
 * start/end lines let the caller sample server CPU over the same window.
 *
 * Usage:
 *   grpcload --port 50051 --path /pkg.Svc/Method --body req.bin
 *            [--host 127.0.0.1] [--id-offset N --id-length L --id-mode uuid|hex|decimal]
 *            [--inflight 8] [--connections 1] [--duration 5] [--warmup 1]
 *            [--header 'name: value']...
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <nghttp2/nghttp2.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define MAX_HEADERS 16
#define OUT_LIMIT (256 * 1024)

enum id_mode { ID_UUID, ID_HEX, ID_DECIMAL };

struct conn;

/* One of the K request slots: it always has one request outstanding. */
struct slot {
    struct conn *conn;
    unsigned char *frame; /* 5-byte gRPC prefix + message */
    size_t frame_len, sent;
    double started;
    int http_status, grpc_status; /* -1 until seen */
    char grpc_message[128];
    int pending; /* waiting to be submitted */
};

struct conn {
    int fd;
    int connected, dead, want_out;
    nghttp2_session *session;
    unsigned char *out;
    size_t out_len, out_cap;
    struct slot **queue; /* slots waiting to be submitted on this connection */
    size_t queued;
};

static struct {
    const char *host, *port, *path, *body_file;
    long id_offset, id_length;
    enum id_mode id_mode;
    int inflight, connections;
    double duration, warmup;
    const char *header_names[MAX_HEADERS], *header_values[MAX_HEADERS];
    int headers;
    char authority[300];
} opt = {"127.0.0.1", NULL, NULL, NULL, -1, 0, ID_UUID, 8, 0, 5.0, 1.0, {0}, {0}, 0, {0}};

static unsigned char *body;
static size_t body_len;
static uint64_t id_counter;
static char id_prefix[17]; /* 16 random hex digits, fixed for the run */

static int phase; /* 0 warmup, 1 measuring, 2 draining */
static double t_start, t_end;
static double *latencies;
static size_t n_lat, cap_lat;
static uint64_t errors, errors_total;
static int first_error_http = -1, first_error_grpc = -1;
static char first_error_message[400];
static int outstanding;

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static double cpu_seconds(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec / 1e6 +
           (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec / 1e6;
}

static void die(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fputs("grpcload: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    exit(2);
}

static void *xmalloc(size_t n) {
    void *p = malloc(n);
    if (!p) die("out of memory");
    return p;
}

/* Write a fresh id over the placeholder: unique within the run (a counter)
 * and across runs (a random prefix). */
static void write_id(unsigned char *msg) {
    static const char hexdigits[] = "0123456789abcdef";
    if (opt.id_offset < 0) return;
    uint64_t n = ++id_counter;
    unsigned char *p = msg + opt.id_offset;
    long len = opt.id_length;
    if (opt.id_mode == ID_DECIMAL) {
        for (long i = len - 1; i >= 0; i--, n /= 10) p[i] = (unsigned char)('0' + n % 10);
        return;
    }
    /* 32 hex digits: 16 of prefix, 16 of counter. */
    char digits[32];
    memcpy(digits, id_prefix, 16);
    for (int i = 31; i >= 16; i--, n >>= 4) digits[i] = hexdigits[n & 15];
    if (opt.id_mode == ID_HEX) {
        /* The rightmost digits carry the counter; a short id drops prefix digits. */
        for (long i = 0; i < len; i++) p[len - 1 - i] = (unsigned char)(i < 32 ? digits[31 - i] : '0');
        return;
    }
    /* UUID v4 layout xxxxxxxx-xxxx-4xxx-8xxx-xxxxxxxxxxxx: 30 free digits, the
     * first 14 of the prefix and the 16 of the counter. */
    static const char layout[] = "xxxxxxxx-xxxx-4xxx-8xxx-xxxxxxxxxxxx";
    const char *free_digits = digits + 2;
    for (int i = 0; i < 36; i++) p[i] = (unsigned char)(layout[i] == 'x' ? *free_digits++ : layout[i]);
}

static void record_latency(double seconds) {
    if (n_lat == cap_lat) {
        cap_lat = cap_lat ? cap_lat * 2 : 65536;
        latencies = realloc(latencies, cap_lat * sizeof(double));
        if (!latencies) die("out of memory");
    }
    latencies[n_lat++] = seconds;
}

static void note_error(struct slot *s, const char *why) {
    errors_total++;
    if (phase == 1) errors++;
    if (first_error_http == -1 && first_error_grpc == -1 && !first_error_message[0]) {
        first_error_http = s->http_status;
        first_error_grpc = s->grpc_status;
        snprintf(first_error_message, sizeof first_error_message, "%s%s%s", why,
                 s->grpc_message[0] ? ": " : "", s->grpc_message);
    }
}

/* ---- nghttp2 callbacks ---------------------------------------------------- */

/* Frames are gathered in one buffer per connection and written with one
 * write() per loop turn, not one per frame. */
static ssize_t on_send(nghttp2_session *session, const uint8_t *data, size_t length, int flags,
                       void *user_data) {
    (void)session;
    (void)flags;
    struct conn *c = user_data;
    if (c->out_len >= OUT_LIMIT) return NGHTTP2_ERR_WOULDBLOCK;
    if (c->out_len + length > c->out_cap) {
        while (c->out_len + length > c->out_cap) c->out_cap = c->out_cap ? c->out_cap * 2 : 65536;
        c->out = realloc(c->out, c->out_cap);
        if (!c->out) die("out of memory");
    }
    memcpy(c->out + c->out_len, data, length);
    c->out_len += length;
    return (ssize_t)length;
}

static ssize_t read_body(nghttp2_session *session, int32_t stream_id, uint8_t *buf, size_t length,
                         uint32_t *data_flags, nghttp2_data_source *source, void *user_data) {
    (void)session;
    (void)stream_id;
    (void)user_data;
    struct slot *s = source->ptr;
    size_t n = s->frame_len - s->sent;
    if (n > length) n = length;
    memcpy(buf, s->frame + s->sent, n);
    s->sent += n;
    if (s->sent == s->frame_len) *data_flags |= NGHTTP2_DATA_FLAG_EOF;
    return (ssize_t)n;
}

static int on_header(nghttp2_session *session, const nghttp2_frame *frame, const uint8_t *name,
                     size_t namelen, const uint8_t *value, size_t valuelen, uint8_t flags,
                     void *user_data) {
    (void)flags;
    (void)user_data;
    if (frame->hd.type != NGHTTP2_HEADERS) return 0;
    struct slot *s = nghttp2_session_get_stream_user_data(session, frame->hd.stream_id);
    if (!s) return 0;
    if (namelen == 7 && memcmp(name, ":status", 7) == 0) {
        s->http_status = atoi((const char *)value);
    } else if (namelen == 11 && memcmp(name, "grpc-status", 11) == 0) {
        s->grpc_status = atoi((const char *)value);
    } else if (namelen == 12 && memcmp(name, "grpc-message", 12) == 0) {
        size_t n = valuelen < sizeof s->grpc_message - 1 ? valuelen : sizeof s->grpc_message - 1;
        memcpy(s->grpc_message, value, n);
        s->grpc_message[n] = 0;
    }
    return 0;
}

static int on_stream_close(nghttp2_session *session, int32_t stream_id, uint32_t error_code,
                           void *user_data) {
    struct conn *c = user_data;
    struct slot *s = nghttp2_session_get_stream_user_data(session, stream_id);
    if (!s) return 0;
    double t = now();
    outstanding--;
    if (error_code != NGHTTP2_NO_ERROR) {
        char why[64];
        snprintf(why, sizeof why, "stream reset (h2 error %u)", error_code);
        note_error(s, why);
    } else if (s->http_status != 200) {
        note_error(s, "HTTP status not 200");
    } else if (s->grpc_status != 0) {
        note_error(s, s->grpc_status == -1 ? "no grpc-status" : "grpc-status not 0");
    } else if (phase == 1 && t <= t_end) {
        record_latency(t - s->started);
    }
    if (phase < 2) {
        s->pending = 1;
        c->queue[c->queued++] = s;
    }
    return 0;
}

/* ---- connections ------------------------------------------------------------ */

static int open_socket(void) {
    struct addrinfo hints = {0}, *res;
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    int rc = getaddrinfo(opt.host, opt.port, &hints, &res);
    if (rc != 0) die("cannot resolve %s: %s", opt.host, gai_strerror(rc));
    int fd = socket(res->ai_family, SOCK_STREAM | SOCK_NONBLOCK, 0);
    if (fd < 0) die("socket: %s", strerror(errno));
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (connect(fd, res->ai_addr, res->ai_addrlen) < 0 && errno != EINPROGRESS)
        die("connect %s:%s: %s", opt.host, opt.port, strerror(errno));
    freeaddrinfo(res);
    return fd;
}

static void conn_init(struct conn *c, nghttp2_session_callbacks *callbacks) {
    memset(c, 0, sizeof *c);
    c->fd = open_socket();
    c->queue = xmalloc((size_t)opt.inflight * sizeof *c->queue);
    if (nghttp2_session_client_new(&c->session, callbacks, c) != 0) die("nghttp2 session");
    nghttp2_settings_entry settings[] = {
        {NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS, 1000},
        {NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE, 1 << 24},
    };
    nghttp2_submit_settings(c->session, NGHTTP2_FLAG_NONE, settings, 2);
    nghttp2_session_set_local_window_size(c->session, NGHTTP2_FLAG_NONE, 0, 1 << 26);
}

static void submit(struct conn *c, struct slot *s) {
    nghttp2_nv nv[4 + 2 + MAX_HEADERS];
    int n = 0;
#define NV(NAME, VALUE)                                                                        \
    nv[n++] = (nghttp2_nv){(uint8_t *)(NAME), (uint8_t *)(VALUE), strlen(NAME), strlen(VALUE), \
                           NGHTTP2_NV_FLAG_NO_COPY_NAME | NGHTTP2_NV_FLAG_NO_COPY_VALUE}
    NV(":method", "POST");
    NV(":scheme", "http");
    NV(":authority", opt.authority);
    NV(":path", opt.path);
    NV("content-type", "application/grpc");
    NV("te", "trailers");
    for (int i = 0; i < opt.headers; i++) NV(opt.header_names[i], opt.header_values[i]);
#undef NV
    write_id(s->frame + 5);
    s->sent = 0;
    s->http_status = -1;
    s->grpc_status = -1;
    s->grpc_message[0] = 0;
    s->pending = 0;
    s->started = now();
    nghttp2_data_provider provider = {.source.ptr = s, .read_callback = read_body};
    int32_t id = nghttp2_submit_request(c->session, NULL, nv, (size_t)n, &provider, s);
    if (id < 0) die("submit: %s", nghttp2_strerror(id));
    outstanding++;
}

static void conn_fail(struct conn *c, const char *why) {
    if (c->dead) return;
    c->dead = 1;
    if (!first_error_message[0]) snprintf(first_error_message, sizeof first_error_message, "%s", why);
    errors_total++;
    close(c->fd);
}

/* Submit queued requests, let nghttp2 frame them, and write what fits. */
static void conn_pump(struct conn *c, int epfd) {
    if (c->dead || !c->connected) return;
    for (size_t i = 0; i < c->queued; i++) submit(c, c->queue[i]);
    c->queued = 0;
    for (;;) {
        int rc = nghttp2_session_send(c->session);
        if (rc != 0) {
            conn_fail(c, nghttp2_strerror(rc));
            return;
        }
        if (c->out_len == 0) break;
        ssize_t w = write(c->fd, c->out, c->out_len);
        if (w < 0) {
            if (errno == EAGAIN) break;
            conn_fail(c, "write failed");
            return;
        }
        memmove(c->out, c->out + w, c->out_len - (size_t)w);
        c->out_len -= (size_t)w;
        if (c->out_len > 0) break; /* the socket is full */
    }
    int want_out = c->out_len > 0;
    if (want_out != c->want_out) {
        struct epoll_event ev = {.events = EPOLLIN | (want_out ? EPOLLOUT : 0), .data.ptr = c};
        epoll_ctl(epfd, EPOLL_CTL_MOD, c->fd, &ev);
        c->want_out = want_out;
    }
}

static void conn_read(struct conn *c) {
    static unsigned char buf[1 << 16];
    for (;;) {
        ssize_t r = read(c->fd, buf, sizeof buf);
        if (r == 0) {
            conn_fail(c, "server closed the connection");
            return;
        }
        if (r < 0) {
            if (errno != EAGAIN) conn_fail(c, "read failed");
            return;
        }
        ssize_t used = nghttp2_session_mem_recv(c->session, buf, (size_t)r);
        if (used < 0) {
            conn_fail(c, nghttp2_strerror((int)used));
            return;
        }
    }
}

/* ---- results ------------------------------------------------------------- */

static int compare(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double percentile(double p) {
    if (n_lat == 0) return 0;
    size_t i = (size_t)(p * (double)(n_lat - 1) + 0.5);
    return latencies[i] * 1e3;
}

static void json_string(const char *s) {
    putchar('"');
    for (; *s; s++) {
        if (*s == '"' || *s == '\\') printf("\\%c", *s);
        else if ((unsigned char)*s < 0x20) printf("\\u%04x", *s);
        else putchar(*s);
    }
    putchar('"');
}

/* ---- main ---------------------------------------------------------------- */

static void read_body_file(void) {
    FILE *f = fopen(opt.body_file, "rb");
    if (!f) die("cannot open %s: %s", opt.body_file, strerror(errno));
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    body = xmalloc((size_t)n + 1);
    if (fread(body, 1, (size_t)n, f) != (size_t)n) die("cannot read %s", opt.body_file);
    fclose(f);
    body_len = (size_t)n;
    if (opt.id_offset >= 0 && opt.id_offset + opt.id_length > (long)body_len)
        die("the id placeholder lies outside the body");
    if (opt.id_mode == ID_UUID && opt.id_offset >= 0 && opt.id_length != 36)
        die("a uuid placeholder is 36 bytes");
}

static void random_prefix(void) {
    unsigned char r[8] = {0};
    FILE *f = fopen("/dev/urandom", "rb");
    if (!f || fread(r, 1, sizeof r, f) != sizeof r) die("cannot read /dev/urandom");
    fclose(f);
    for (int i = 0; i < 8; i++) sprintf(id_prefix + 2 * i, "%02x", r[i]);
}

static void parse_args(int argc, char **argv) {
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (i + 1 >= argc) die("option %s needs a value", a);
        const char *v = argv[++i];
        if (!strcmp(a, "--host")) opt.host = v;
        else if (!strcmp(a, "--port")) opt.port = v;
        else if (!strcmp(a, "--path")) opt.path = v;
        else if (!strcmp(a, "--body")) opt.body_file = v;
        else if (!strcmp(a, "--id-offset")) opt.id_offset = atol(v);
        else if (!strcmp(a, "--id-length")) opt.id_length = atol(v);
        else if (!strcmp(a, "--inflight")) opt.inflight = atoi(v);
        else if (!strcmp(a, "--connections")) opt.connections = atoi(v);
        else if (!strcmp(a, "--duration")) opt.duration = atof(v);
        else if (!strcmp(a, "--warmup")) opt.warmup = atof(v);
        else if (!strcmp(a, "--id-mode")) {
            if (!strcmp(v, "uuid")) opt.id_mode = ID_UUID;
            else if (!strcmp(v, "hex")) opt.id_mode = ID_HEX;
            else if (!strcmp(v, "decimal")) opt.id_mode = ID_DECIMAL;
            else die("--id-mode is uuid, hex or decimal");
        } else if (!strcmp(a, "--header")) {
            if (opt.headers == MAX_HEADERS) die("too many headers");
            char *copy = strdup(v), *colon = strchr(copy, ':');
            if (!colon) die("a header is 'name: value'");
            *colon = 0;
            for (char *p = copy; *p; p++) *p = (char)(*p >= 'A' && *p <= 'Z' ? *p + 32 : *p);
            for (colon++; *colon == ' '; colon++) {
            }
            opt.header_names[opt.headers] = copy;
            opt.header_values[opt.headers++] = colon;
        } else die("unknown option %s", a);
    }
    if (!opt.port || !opt.path || !opt.body_file) die("--port, --path and --body are required");
    if (opt.inflight < 1) die("--inflight must be at least 1");
    if (opt.connections < 1) opt.connections = (opt.inflight + 7) / 8;
    if (opt.connections > opt.inflight) opt.connections = opt.inflight;
    snprintf(opt.authority, sizeof opt.authority, "%s:%s", opt.host, opt.port);
}

int main(int argc, char **argv) {
    parse_args(argc, argv);
    read_body_file();
    random_prefix();

    nghttp2_session_callbacks *callbacks;
    nghttp2_session_callbacks_new(&callbacks);
    nghttp2_session_callbacks_set_send_callback(callbacks, on_send);
    nghttp2_session_callbacks_set_on_header_callback(callbacks, on_header);
    nghttp2_session_callbacks_set_on_stream_close_callback(callbacks, on_stream_close);

    int epfd = epoll_create1(0);
    struct conn *conns = xmalloc((size_t)opt.connections * sizeof *conns);
    for (int i = 0; i < opt.connections; i++) {
        conn_init(&conns[i], callbacks);
        struct epoll_event ev = {.events = EPOLLIN | EPOLLOUT, .data.ptr = &conns[i]};
        conns[i].want_out = 1;
        epoll_ctl(epfd, EPOLL_CTL_ADD, conns[i].fd, &ev);
    }
    struct slot *slots = xmalloc((size_t)opt.inflight * sizeof *slots);
    for (int i = 0; i < opt.inflight; i++) {
        struct slot *s = &slots[i];
        memset(s, 0, sizeof *s);
        s->conn = &conns[i % opt.connections];
        s->frame_len = body_len + 5;
        s->frame = xmalloc(s->frame_len);
        s->frame[0] = 0; /* not compressed */
        s->frame[1] = (unsigned char)(body_len >> 24);
        s->frame[2] = (unsigned char)(body_len >> 16);
        s->frame[3] = (unsigned char)(body_len >> 8);
        s->frame[4] = (unsigned char)body_len;
        memcpy(s->frame + 5, body, body_len);
        s->conn->queue[s->conn->queued++] = s;
    }

    double began = now(), cpu_start = 0, cpu_end = 0, drain_deadline = 0;
    t_start = began + opt.warmup;
    t_end = t_start + opt.duration;
    struct epoll_event events[64];
    for (;;) {
        double t = now();
        if (phase == 0 && t >= t_start) {
            phase = 1;
            t_start = t;
            t_end = t + opt.duration;
            cpu_start = cpu_seconds();
            puts("start");
            fflush(stdout);
        }
        if (phase == 1 && t >= t_end) {
            phase = 2;
            t_end = t;
            cpu_end = cpu_seconds();
            puts("end");
            fflush(stdout);
            drain_deadline = t + 2.0;
        }
        int alive = 0;
        for (int i = 0; i < opt.connections; i++) alive += !conns[i].dead;
        if (!alive) break;
        if (phase == 2 && (outstanding == 0 || t >= drain_deadline)) break;
        double next = phase == 0 ? t_start : phase == 1 ? t_end : drain_deadline;
        int timeout = (int)((next - t) * 1000) + 1;
        int n = epoll_wait(epfd, events, 64, timeout);
        for (int i = 0; i < n; i++) {
            struct conn *c = events[i].data.ptr;
            if (c->dead) continue;
            if (!c->connected && (events[i].events & (EPOLLOUT | EPOLLERR | EPOLLHUP))) {
                int err = 0;
                socklen_t len = sizeof err;
                getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &err, &len);
                if (err) {
                    char why[400];
                    snprintf(why, sizeof why, "connect to %s failed: %s", opt.authority, strerror(err));
                    conn_fail(c, why);
                    continue;
                }
                c->connected = 1;
            }
            if (events[i].events & (EPOLLIN | EPOLLHUP | EPOLLERR)) conn_read(c);
        }
        for (int i = 0; i < opt.connections; i++) conn_pump(&conns[i], epfd);
    }
    if (phase < 2) {
        /* Every connection died before the window closed. */
        if (phase == 1) cpu_end = cpu_seconds();
        t_end = now();
        if (phase == 0) t_start = t_end;
    }

    qsort(latencies, n_lat, sizeof *latencies, compare);
    double window = t_end - t_start;
    printf("{\"requests\": %zu, \"errors\": %llu, \"errors_total\": %llu, \"duration\": %.4f, "
           "\"rps\": %.1f, \"p50_ms\": %.3f, \"p90_ms\": %.3f, \"p99_ms\": %.3f, "
           "\"max_ms\": %.3f, \"cpu_seconds\": %.4f, \"cpu_cores\": %.4f, \"inflight\": %d, "
           "\"connections\": %d, \"first_error\": ",
           n_lat, (unsigned long long)errors, (unsigned long long)errors_total, window,
           window > 0 ? (double)n_lat / window : 0.0, percentile(0.50), percentile(0.90),
           percentile(0.99), n_lat ? latencies[n_lat - 1] * 1e3 : 0.0, cpu_end - cpu_start,
           window > 0 ? (cpu_end - cpu_start) / window : 0.0, opt.inflight, opt.connections);
    if (first_error_message[0]) {
        printf("{\"http_status\": %d, \"grpc_status\": %d, \"message\": ", first_error_http,
               first_error_grpc);
        json_string(first_error_message);
        printf("}}\n");
    } else {
        printf("null}\n");
    }
    return errors_total ? 1 : 0;
}
