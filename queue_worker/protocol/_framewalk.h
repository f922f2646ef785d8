/* The walk over a buffer's frames that logstore.file.framing._decode_loop defines, for the C
   loop that follows it: queue_worker/protocol/_cdecode.c (decode_claims_frames, a fold reader's
   span). Frames only: no rule of the protocol is here.
*/
#ifndef QW_FRAMEWALK_H
#define QW_FRAMEWALK_H

#include <stdint.h>
#include <zlib.h>

#define HEADER 12
#define LENGTH_MASK 0x7FFFFFFFu

static uint32_t
le32(const unsigned char *p)
{
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}

/* The walk of framing._decode_loop over `buf` (bytes), calling keep(frame offset, frame
   end, payload start, length) for each frame kept; returns 0, or -1 with an error set. */
typedef int (*keeper)(void *state, long long pos, long long end, const unsigned char *data,
                      long long length);

static int
frame_walk(PyObject *buf, long long max_record, long long verified, long long limit,
           keeper keep, void *state, long long *pos_out, long long *batch_out, long long *ready_out)
{
    const unsigned char *base = (const unsigned char *)PyBytes_AS_STRING(buf);
    long long size = (long long)PyBytes_GET_SIZE(buf);
    long long last = size - HEADER;
    long long pos = 0, batch_start = 0, ready = 0, kept = 0;
    while (pos <= last) {
        const unsigned char *h = base + pos;
        uint32_t word = le32(h), check = le32(h + 4), crc = le32(h + 8);
        long long length = (long long)(word & LENGTH_MASK);
        long long start = pos + HEADER, end = start + length;
        if ((word ^ check) != 0xFFFFFFFFu || length > max_record || end > size)
            break;
        uLong sum = crc32((uLong)word, base + start, (uInt)length);
        if ((uint32_t)sum != crc)
            break;
        if (keep(state, pos, end, base + start, length) < 0)
            return -1;
        kept++;
        pos = end;
        if (!(word & 0x80000000u) || end <= verified) {
            batch_start = end;
            ready = kept;
            if (ready >= limit)
                break;
        }
    }
    *pos_out = pos;
    *batch_out = batch_start;
    *ready_out = ready;
    return 0;
}

#endif
