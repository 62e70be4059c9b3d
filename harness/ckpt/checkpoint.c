/* Checkpoints: the writers' shards, index.json, and the verified reads of --resume (see
 * checkpoint.h for the format and the order of the writes). */
#define _POSIX_C_SOURCE 200809L

#include "sets.h"
#include "checkpoint.h"
#include "checkpoint_index.h"
#include "optimizer.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "grid_ckpt.h"
#include "json.h"
#include "resume.h"
#include "rank.h"
#include "report.h"
#include "run.h"
#include "safetensors.h"

/* ---- small helpers ----------------------------------------------------------------------- */

/* fsync a file or directory by path. */
static seldp_status sync_path(const char *path, bool directory)
{
    int fd = open(path, directory ? O_RDONLY | O_DIRECTORY : O_RDONLY);
    if (fd < 0)
        return hx_fail(SELDP_ERR_IO, "%s: cannot open to sync: %s", path, strerror(errno));
    int rc = fsync(fd);
    int saved = errno;
    close(fd);
    if (rc != 0)
        return hx_fail(SELDP_ERR_IO, "%s: fsync failed: %s", path, strerror(saved));
    return SELDP_OK;
}

/* The temporary file is complete and durable before it takes its final name. */
static seldp_status publish(const char *tmp, const char *final)
{
    seldp_status st = sync_path(tmp, false);
    if (st != SELDP_OK)
        return st;
    if (rename(tmp, final) != 0)
        return hx_fail(SELDP_ERR_IO, "%s: cannot rename to %s: %s", tmp, final, strerror(errno));
    return SELDP_OK;
}

static void shard_name(char *buf, size_t size, int step, int generation, int rank)
{
    snprintf(buf, size, "step%06d-g%d-rank%05d.safetensors", step, generation, rank);
}

/* The generation of a shard's name (or of its temporary name), or -1 for any other name. */
static int shard_generation(const char *name)
{
    int step = 0, generation = 0, rank = 0, end = 0;
    if (sscanf(name, "step%d-g%d-rank%d.safetensors%n", &step, &generation, &rank, &end) != 3 ||
        end <= 0 || (name[end] != '\0' && strcmp(name + end, ".tmp") != 0))
        return -1;
    return generation;
}

int hx_ckpt_next_generation(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d)
        return 0;
    int next = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        int g = shard_generation(e->d_name);
        if (g >= next)
            next = g + 1;
    }
    closedir(d);
    return next;
}

bool hx_ckpt_due(const hx_run *run, int step)
{
    const hx_options *o = &run->opts;
    if (!o->save_dir)
        return false;
    return step == o->steps - 1 || (o->save_every > 0 && (step + 1) % o->save_every == 0);
}

/* ---- save -------------------------------------------------------------------------------- */

seldp_status hx_ckpt_write_rank(hx_rank *rk, int step)
{
    seldp_status st = SELDP_OK;
    hx_run *run = rk->run;
    const char *dir = run->opts.save_dir;
    hx_st_writer *w = NULL;
    char name[256], final[4096], tmp[4200], number[32];
    size_t written = 0;
    hx_grid_ckpt_keep keep = {0};
    rk->saved_token_state = rk->token_state;
    HX_CHECK(hx_st_writer_create(&w));
    /* one writer per replica set, logical tensors gathered from the shards */
    HX_CHECK(hx_grid_ckpt_add(rk, w, &keep));
    written = keep.written;
    if (written == 0)
        goto fail; /* this rank roots no replica set */
    HX_CHECK(hx_st_add_metadata(w, "format", CKPT_FORMAT));
    snprintf(number, sizeof number, "%d", step + 1);
    HX_CHECK(hx_st_add_metadata(w, "step", number));
    snprintf(number, sizeof number, "%d", rk->rank);
    HX_CHECK(hx_st_add_metadata(w, "rank", number));
    HX_CHECK(hx_mkdir_p(dir));
    shard_name(name, sizeof name, step + 1, run->ckpt_generation, rk->rank);
    snprintf(final, sizeof final, "%s/%s", dir, name);
    snprintf(tmp, sizeof tmp, "%s.tmp", final);
    HX_CHECK(hx_st_write(w, tmp));
    HX_CHECK(publish(tmp, final));
fail:
    hx_st_writer_destroy(w);
    hx_grid_ckpt_keep_free(&keep);
    if (st != SELDP_OK) {
        char why[768];
        snprintf(why, sizeof why, "%s", hx_last_error());
        hx_fail(st, "rank %d: saving step %d into %s: %s", rk->rank, step + 1, dir, why);
    }
    return st;
}

static uint64_t le64(const unsigned char *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

static void json_shape(hx_buf *b, int ndim, const int64_t *shape)
{
    hx_buf_puts(b, "[");
    for (int d = 0; d < ndim; d++)
        hx_buf_printf(b, "%s%lld", d ? ", " : "", (long long)shape[d]);
    hx_buf_puts(b, "]");
}

/* The first byte of tensor `name` in a shard: after the 8-byte length and the header, at
 * its data_offsets[0]. false when the header does not hold it. */
static bool tensor_offset(const hx_json *header, uint64_t header_bytes, const char *name,
                          uint64_t *offset)
{
    const hx_json *offsets = hx_json_get(hx_json_get(header, name), "data_offsets");
    if (!offsets || offsets->type != HX_JSON_ARRAY || offsets->count != 2 ||
        !offsets->items[0].is_integer || offsets->items[0].integer < 0)
        return false;
    *offset = header_bytes + (uint64_t)offsets->items[0].integer;
    return true;
}

/* The index entries of one shard, read back from the disk. */
static seldp_status index_shard(const char *dir, const char *name, hx_buf *files, hx_buf *tensors,
                                bool *first_tensor)
{
    seldp_status st = SELDP_OK;
    char path[4096];
    char *bytes = NULL;
    size_t len = 0;
    hx_st_file *f = NULL;
    hx_json *json = NULL;
    snprintf(path, sizeof path, "%s/%s", dir, name);
    HX_CHECK(hx_read_file(path, &bytes, &len));
    HX_CHECK(hx_st_parse(bytes, len, path, &f));
    uint64_t header = 8 + le64((const unsigned char *)bytes);
    HX_CHECK(hx_json_parse(bytes + 8, (size_t)header - 8, path, &json));
    hx_buf_printf(files, "%s\n    ", files->len ? "," : "");
    hx_buf_json_string(files, name);
    hx_buf_printf(files, ": {\"bytes\": %zu, \"header_checksum\": \"%016" PRIx64 "\"}", len,
                  hx_checksum(bytes, (size_t)header));
    for (size_t i = 0; i < hx_st_count(f); i++) {
        const hx_st_tensor *t = hx_st_at(f, i);
        uint64_t offset = 0;
        if (!tensor_offset(json, header, t->name, &offset))
            HX_FAIL(SELDP_ERR_INTERNAL, "%s: no data_offsets for %s", path, t->name);
        hx_buf_printf(tensors, "%s\n    ", *first_tensor ? "" : ",");
        *first_tensor = false;
        hx_buf_json_string(tensors, t->name);
        hx_buf_printf(tensors, ": {\"shape\": ");
        json_shape(tensors, t->ndim, t->shape);
        hx_buf_printf(tensors, ", \"dtype\": \"%s\", \"file\": ", hx_st_dtype_name(t->dtype));
        hx_buf_json_string(tensors, name);
        hx_buf_puts(tensors, ", \"slice\": [");
        for (int d = 0; d < t->ndim; d++)
            hx_buf_printf(tensors, "%s[0, %lld]", d ? ", " : "", (long long)t->shape[d]);
        hx_buf_puts(tensors, "]");
        hx_buf_printf(
            tensors, ", \"offsets\": [%" PRIu64 ", %" PRIu64 "], \"checksum\": \"%016" PRIx64 "\"}",
            offset, offset + (uint64_t)t->nbytes, hx_checksum(t->data, t->nbytes));
    }
fail:
    hx_json_free(json);
    hx_st_file_free(f);
    free(bytes);
    return st;
}

/* Remove what the new index does not name: older shards and the temporary files of saves
 * that did not finish. */
static void remove_stale(const char *dir, int step, int generation, const bool *writes, int world)
{
    DIR *d = opendir(dir);
    if (!d)
        return;
    struct dirent *e;
    char path[4096], keep[256];
    while ((e = readdir(d)) != NULL) {
        const char *n = e->d_name;
        bool shard = shard_generation(n) >= 0;
        if (!shard && strcmp(n, CKPT_INDEX ".tmp") != 0)
            continue; /* not a file of a checkpoint: left alone */
        bool named = false;
        for (int r = 0; shard && r < world && !named; r++) {
            shard_name(keep, sizeof keep, step, generation, r);
            named = writes[r] && strcmp(keep, n) == 0;
        }
        if (named)
            continue;
        snprintf(path, sizeof path, "%s/%s", dir, n);
        unlink(path);
    }
    closedir(d);
}

seldp_status hx_ckpt_commit(hx_run *run, int step)
{
    seldp_status st = SELDP_OK;
    const hx_options *o = &run->opts;
    const hx_layout *l = run->layout;
    const char *dir = o->save_dir;
    int W = o->world;
    hx_buf files = {0}, tensors = {0}, text = {0};
    char name[256], path[4096], tmp[4200];
    bool first = true;
    bool *writes = hx_calloc((size_t)W, sizeof *writes);
    if (!writes)
        return SELDP_ERR_NOMEM;
    for (int r = 0; r < W; r++)
        for (size_t i = 0; i < tm_param_count(run->ranks[r].model); i++)
            writes[r] = writes[r] || hx_set_writes(run, r, tm_param_at(run->ranks[r].model, i));
    HX_CHECK(sync_path(dir, true)); /* the shards' renames are durable before the index */
    for (int r = 0; r < W; r++) {
        if (!writes[r])
            continue;
        shard_name(name, sizeof name, step + 1, run->ckpt_generation, r);
        HX_CHECK(index_shard(dir, name, &files, &tensors, &first));
    }
    const hx_rank *rk0 = &run->ranks[hx_backend_local_first(run->backend)];
    hx_buf_printf(&text, "{\n  \"format\": \"%s\",\n  \"version\": %d,\n  \"step\": %d,\n",
                  CKPT_FORMAT, CKPT_VERSION, step + 1);
    hx_buf_printf(&text, "  \"generation\": %d,\n  \"config\": ", run->ckpt_generation);
    hx_config_json(&o->model, &text);
    hx_buf_printf(&text, ",\n  \"layout\": ");
    hx_layout_json(l, &text);
    hx_buf_printf(&text,
                  ",\n  \"training\": {\"lr\": %.17g, \"fp32_master\": %s, \"expert_reduce\": "
                  "\"%s\", \"global_batch\": %d",
                  o->lr, o->fp32_master ? "true" : "false", hx_flow_name(o->flow), o->global_batch);
    hx_opt_ckpt_json(run, &text); /* the optimizer's step counts, the loss scale (optimizer.h) */
    hx_buf_puts(&text, "},\n");
    if (o->global_batch > 0)
        hx_buf_printf(
            &text, "  \"token_stream\": {\"kind\": \"global\", \"state\": \"%016" PRIx64 "\"},\n",
            rk0->saved_token_state);
    else
        hx_buf_printf(&text, "  \"token_stream\": {\"kind\": \"per-rank\", \"next_step\": %d},\n",
                      step + 1);
    hx_buf_printf(&text, "  \"checksum\": \"fnv1a64\",\n  \"files\": {%s\n  },\n",
                  hx_buf_str(&files));
    hx_buf_printf(&text, "  \"tensors\": {%s\n  },\n", hx_buf_str(&tensors));
    uint64_t sum = hx_checksum(text.data, text.len);
    hx_buf_printf(&text, "  " CKPT_INDEX_CHECKSUM ": \"%016" PRIx64 "\"\n}\n", sum);
    if (!hx_buf_ok(&text) || !hx_buf_ok(&files) || !hx_buf_ok(&tensors))
        HX_FAIL(SELDP_ERR_NOMEM, "%s: out of memory building the index", dir);
    snprintf(path, sizeof path, "%s/" CKPT_INDEX, dir);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    HX_CHECK(hx_write_file(tmp, text.data, text.len));
    HX_CHECK(publish(tmp, path));
    HX_CHECK(sync_path(dir, true));
    remove_stale(dir, step + 1, run->ckpt_generation, writes, W);
    run->ckpt_generation++;
fail:
    if (st != SELDP_OK) {
        char why[768];
        snprintf(why, sizeof why, "%s", hx_last_error());
        hx_fail(st, "saving step %d into %s: %s", step + 1, dir, why);
    }
    free(writes);
    hx_buf_free(&files);
    hx_buf_free(&tensors);
    hx_buf_free(&text);
    return st;
}

seldp_status hx_ckpt_open(const char *dir, hx_ckpt **out)
{
    seldp_status st = SELDP_OK;
    char path[4096];
    char *text = NULL;
    size_t len = 0;
    struct stat sb;
    *out = NULL;
    snprintf(path, sizeof path, "%s/" CKPT_INDEX, dir);
    if (stat(path, &sb) != 0)
        return hx_fail(SELDP_ERR_IO, "%s: missing: %s (no complete checkpoint in %s)", path,
                       strerror(errno), dir);
    HX_CHECK(hx_read_file(path, &text, &len));
    HX_CHECK(hx_ckpt_parse(text, len, path, dir, out));
fail:
    free(text);
    return st;
}

/* ---- resume: checks against the run, and the reads --------------------------------------- */

static const ckpt_tensor *find_tensor(const hx_ckpt *c, const char *path)
{
    for (size_t i = 0; i < c->n_tensors; i++)
        if (strcmp(c->tensors[i].path, path) == 0)
            return &c->tensors[i];
    return NULL;
}

/* Every tensor of the logical model (all experts) has an entry of its shape and dtype whose
 * slice covers it; FP32 master weights of the trainable ones too. */
static seldp_status check_tensors(const hx_ckpt *c, const char *index, const hx_options *o)
{
    seldp_status st = SELDP_OK;
    tm_model *logical = NULL;
    int E = o->model.experts;
    int *all = hx_calloc((size_t)E, sizeof *all);
    char master[300], exp_avg[300], exp_avg_sq[300];
    if (!all)
        return SELDP_ERR_NOMEM;
    if (c->adamw != (o->optimizer == HX_OPT_ADAMW)) {
        free(all);
        return hx_fail(SELDP_ERR_INVALID_ARGUMENT,
                       "%s: saved with --optimizer %s; resume with the same optimizer (its state "
                       "is part of the checkpoint, or absent from it)",
                       index, c->adamw ? "adamw" : "sgd");
    }
    for (int e = 0; e < E; e++)
        all[e] = e;
    HX_CHECK_LIB(tm_model_create(&o->model, 0, all, E, NULL, NULL, &logical),
                 "the model of the checkpoint check");
    size_t expected = 0;
    for (size_t i = 0; i < tm_param_count(logical); i++) {
        const tm_param_info *p = tm_param_at(logical, i);
        if (p->alias)
            continue;
        bool trainable = !p->frozen && (p->role & TM_ROLES_TRAINABLE);
        bool with_master = trainable && hx_opt_keeps_master(o, p->tensor.dtype);
        bool with_moments = trainable && o->optimizer == HX_OPT_ADAMW;
        /* the parameter, its master, AdamW's moments (optimizer.h) */
        const char *names[4] = {p->path, NULL, NULL, NULL};
        int k = 1;
        if (with_master) {
            snprintf(master, sizeof master, CKPT_MASTER_PREFIX "%s", p->path);
            names[k++] = master;
        }
        if (with_moments) {
            snprintf(exp_avg, sizeof exp_avg, CKPT_EXP_AVG_PREFIX "%s", p->path);
            snprintf(exp_avg_sq, sizeof exp_avg_sq, CKPT_EXP_AVG_SQ_PREFIX "%s", p->path);
            names[k++] = exp_avg;
            names[k++] = exp_avg_sq;
        }
        for (int m = 0; m < k; m++) {
            const char *path = names[m];
            seldp_dtype dtype = m ? SELDP_F32 : p->tensor.dtype;
            const ckpt_tensor *t = find_tensor(c, path);
            expected++;
            if (!t)
                HX_FAIL(SELDP_ERR_INVALID_ARGUMENT,
                        "%s: no tensor %s: the index does not match the model config", index, path);
            if (t->dtype != dtype)
                HX_FAIL(SELDP_ERR_INVALID_ARGUMENT, "%s: %s is %s, the model stores %s", index,
                        path, hx_st_dtype_name(t->dtype), hx_st_dtype_name(dtype));
            bool same = t->ndim == p->tensor.ndim;
            for (int d = 0; same && d < t->ndim; d++)
                same = t->shape[d] == p->tensor.shape[d] && t->slice[d][0] == 0 &&
                       t->slice[d][1] == t->shape[d];
            if (!same)
                HX_FAIL(SELDP_ERR_INVALID_ARGUMENT,
                        "%s: %s: shape or slice does not match the model's whole tensor", index,
                        path);
        }
    }
    if (expected != c->n_tensors)
        HX_FAIL(SELDP_ERR_INVALID_ARGUMENT,
                "%s: %zu tensors, the model config has %zu: the index does not match it", index,
                c->n_tensors, expected);
fail:
    tm_model_destroy(logical);
    free(all);
    return st;
}

/* One shard whole: its size, its header against the index, and every tensor's checksum. */
static seldp_status check_file(const hx_ckpt *c, int index_of_file)
{
    seldp_status st = SELDP_OK;
    const ckpt_file *f = &c->files[index_of_file];
    char path[4096];
    char *bytes = NULL;
    size_t len = 0;
    hx_st_file *sf = NULL;
    hx_json *header = NULL;
    struct stat sb;
    snprintf(path, sizeof path, "%s/%s", c->dir, f->name);
    if (stat(path, &sb) != 0)
        HX_FAIL(SELDP_ERR_IO, "%s: missing: %s", path, strerror(errno));
    if ((uint64_t)sb.st_size != f->bytes)
        HX_FAIL(SELDP_ERR_IO, "%s: %s: %lld bytes, the index says %" PRIu64, path,
                (uint64_t)sb.st_size < f->bytes ? "truncated" : "wrong size", (long long)sb.st_size,
                f->bytes);
    HX_CHECK(hx_read_file(path, &bytes, &len));
    uint64_t header_bytes = 8 + le64((const unsigned char *)bytes);
    if (header_bytes > len || hx_fnv1a(bytes, (size_t)header_bytes, c->basis) != f->header_checksum)
        HX_FAIL(SELDP_ERR_PARSE, "%s: corrupted: the header's checksum differs from the index's",
                path);
    HX_CHECK(hx_st_parse(bytes, len, path, &sf));
    HX_CHECK(hx_json_parse(bytes + 8, (size_t)header_bytes - 8, path, &header));
    for (size_t i = 0; i < c->n_tensors; i++) {
        const ckpt_tensor *t = &c->tensors[i];
        if (t->file != index_of_file)
            continue;
        const hx_st_tensor *s = hx_st_find(sf, t->path);
        uint64_t offset = 0;
        bool same = s && s->dtype == t->dtype && s->ndim == t->ndim &&
                    tensor_offset(header, header_bytes, t->path, &offset) && offset == t->offset &&
                    s->nbytes == t->nbytes;
        for (int d = 0; same && d < t->ndim; d++)
            same = s->shape[d] == t->slice[d][1] - t->slice[d][0];
        if (!same)
            HX_FAIL(SELDP_ERR_PARSE,
                    "%s: %s: not where, or not of the dtype and shape, the "
                    "index says",
                    path, t->path);
        if (hx_fnv1a(bytes + t->offset, (size_t)t->nbytes, c->basis) != t->checksum)
            HX_FAIL(SELDP_ERR_PARSE, "%s: corrupted: %s does not match its checksum", path,
                    t->path);
    }
fail:
    hx_json_free(header);
    hx_st_file_free(sf);
    free(bytes);
    return st;
}

seldp_status hx_ckpt_verify(hx_ckpt *c, const hx_options *o)
{
    seldp_status st = SELDP_OK;
    char index[4096];
    snprintf(index, sizeof index, "%s/" CKPT_INDEX, c->dir);
    HX_CHECK(hx_resume_check(c, index, o)); /* what may change, what is refused (resume.h) */
    HX_CHECK(check_tensors(c, index, o));
    for (size_t i = 0; i < c->n_files; i++)
        HX_CHECK(check_file(c, (int)i));
fail:
    return st;
}

const char *hx_ckpt_notes(const hx_ckpt *c)
{
    return c && c->notes ? c->notes : "";
}

/* Read the bytes of one entry (its slice) and check them against its checksum. */
static seldp_status read_entry(const hx_ckpt *c, const ckpt_tensor *t, void *dst, size_t nbytes,
                               int rank)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", c->dir, c->files[t->file].name);
    if (nbytes != t->nbytes)
        return hx_fail(SELDP_ERR_INTERNAL, "rank %d: %s: %s holds %" PRIu64 " bytes, expected %zu",
                       rank, path, t->path, t->nbytes, nbytes);
    int fd = open(path, O_RDONLY);
    if (fd < 0)
        return hx_fail(SELDP_ERR_IO, "rank %d: %s: cannot open: %s", rank, path, strerror(errno));
    size_t done = 0;
    while (done < nbytes) {
        ssize_t n = pread(fd, (char *)dst + done, nbytes - done, (off_t)(t->offset + done));
        if (n <= 0) {
            int saved = errno;
            close(fd);
            return hx_fail(SELDP_ERR_IO, "rank %d: %s: truncated reading %s: %s", rank, path,
                           t->path, n == 0 ? "end of file" : strerror(saved));
        }
        done += (size_t)n;
    }
    close(fd);
    if (hx_fnv1a(dst, nbytes, c->basis) != t->checksum)
        return hx_fail(SELDP_ERR_PARSE, "rank %d: %s: corrupted: %s does not match its checksum",
                       rank, path, t->path);
    return SELDP_OK;
}

/* A sharded rank's part of a logical entry (grid_ckpt.h): the whole entry read and checked,
 * then the rank's range of it. */
static seldp_status read_part(const hx_ckpt *c, const ckpt_tensor *t, const hx_rank *rk,
                              const tm_param_info *p, bool master, void *dst)
{
    hx_shard s = hx_grid_shard(rk->run, rk->rank, p->path);
    seldp_tensor lt = hx_grid_logical_view(&p->tensor, s, master ? SELDP_F32 : p->tensor.dtype);
    void *whole = hx_calloc(seldp_tensor_nbytes(&lt) + 1, 1);
    if (!whole)
        return hx_fail(SELDP_ERR_NOMEM, "rank %d: out of memory", rk->rank);
    seldp_status st = read_entry(c, t, whole, seldp_tensor_nbytes(&lt), rk->rank);
    if (st == SELDP_OK)
        hx_shard_copy(whole, &lt, dst, s, false);
    free(whole);
    return st;
}

seldp_status hx_ckpt_load_moments(const hx_ckpt *c, hx_rank *rk)
{
    char name[300];
    for (size_t i = 0; i < tm_param_count(rk->model); i++) {
        const tm_param_info *p = tm_param_at(rk->model, i);
        float *moment[2];
        if (p->alias || p->frozen || !(p->role & TM_ROLES_TRAINABLE))
            continue;
        hx_opt_set_steps(rk, i, hx_ckpt_steps_of(c, hx_grid_logical_path(p->path)));
        if (!hx_opt_moments(rk, i, &moment[0], &moment[1]))
            continue;
        for (int k = 0; k < 2; k++) {
            snprintf(name, sizeof name, "%s%s", k ? CKPT_EXP_AVG_SQ_PREFIX : CKPT_EXP_AVG_PREFIX,
                     hx_grid_logical_path(p->path));
            const ckpt_tensor *t = find_tensor(c, name);
            if (!t)
                return hx_fail(SELDP_ERR_INVALID_ARGUMENT,
                               "rank %d: %s/" CKPT_INDEX ": no tensor %s", rk->rank, c->dir, name);
            size_t nbytes = seldp_tensor_numel(&p->tensor) * sizeof(float);
            seldp_status st = rk->grid ? read_part(c, t, rk, p, true, moment[k])
                                       : read_entry(c, t, moment[k], nbytes, rk->rank);
            if (st != SELDP_OK)
                return st;
        }
    }
    return SELDP_OK;
}

bool hx_ckpt_loss_scale(const hx_ckpt *c, double *scale, int64_t *good)
{
    if (!c || !c->loss_scale_known)
        return false;
    *scale = c->loss_scale;
    *good = c->loss_scale_good;
    return true;
}

int64_t hx_ckpt_steps_of(const hx_ckpt *c, const char *path)
{
    for (size_t i = 0; i < c->n_steps; i++)
        if (strcmp(c->step_paths[i], path) == 0)
            return c->steps[i];
    return 0;
}

seldp_status hx_ckpt_load_rank(const hx_ckpt *c, hx_rank *rk, bool master)
{
    char name[300];
    for (size_t i = 0; i < tm_param_count(rk->model); i++) {
        const tm_param_info *p = tm_param_at(rk->model, i);
        if (p->alias || (master && !(rk->master && rk->master[i])))
            continue;
        snprintf(name, sizeof name, "%s%s", master ? CKPT_MASTER_PREFIX : "",
                 hx_grid_logical_path(p->path));
        const ckpt_tensor *t = find_tensor(c, name);
        if (!t)
            return hx_fail(SELDP_ERR_INVALID_ARGUMENT, "rank %d: %s/" CKPT_INDEX ": no tensor %s",
                           rk->rank, c->dir, name);
        size_t numel = seldp_tensor_numel(&p->tensor);
        void *dst = master ? (void *)rk->master[i] : p->tensor.data;
        size_t nbytes = master ? numel * sizeof(float) : seldp_tensor_nbytes(&p->tensor);
        seldp_status st = rk->grid ? read_part(c, t, rk, p, master, dst)
                                   : read_entry(c, t, dst, nbytes, rk->rank);
        if (st != SELDP_OK)
            return st;
    }
    return SELDP_OK;
}
