"""Demux only around the requested clip windows, then decode only the picked frames from memory.

Why: ClipBERT picks its frames by index into the decoded window (every frame with pts in
[start, end] plus the first one past end), so a fast decoder must know the window's timestamps
before it decodes. Reading every packet of the file for that (a full index) costs more than
decoding the few picked frames of a long video. Here each window is demuxed from the same seek
point ClipBERT's decoder uses, only until no later packet can still belong to the window (packets
come in decode order with non-decreasing dts and pts >= dts, so once dts reaches the first pts past
the end, the window is complete). The packets stay in memory, so the picked frames are then decoded
without a second seek: from the last keyframe before each, skipping the non-reference frames that
are not wanted (`skip_frame=NONREF`), stopping at the last wanted frame.

Anything unusual (a packet without pts/dts, pts < dts, duplicate pts, a frame that does not come
out) makes the caller fall back to ClipBERT's reference decode for that clip; see decoder.py.
"""
import bisect

SEEK_MARGIN = 1024  # pts margin before the window start (ClipBERT/SlowFast)


class UnsafeStream(Exception):
    """The packets break an assumption the window scan relies on; use the reference path."""


def _check(pts, dts):
    if pts is None or dts is None or pts < dts:
        raise UnsafeStream(f"packet pts={pts} dts={dts}")


class Segment:
    """Packets of the video stream in decode order, demuxed from one seek point and kept in memory."""

    def __init__(self, container, seek_pts):
        stream = container.streams.video[0]
        container.seek(seek_pts, any_frame=False, backward=True, stream=stream)
        self._packets_iter = container.demux(stream)
        self.packets, self.pts, self.dts, self.key_pos = [], [], [], []
        self.sorted_pts, self.last_dts, self.eof = [], None, False
        self.max_gop = 0  # largest pts distance between consecutive keyframes seen

    def _next_packet(self):
        """The next non-empty packet (None at the end), checked for what the window scan relies on."""
        for packet in self._packets_iter:
            if packet.size:
                _check(packet.pts, packet.dts)
                return packet
        self.eof = True
        return None

    def _append(self, packet, pts, dts):
        sorted_pts = self.sorted_pts
        i = bisect.bisect_left(sorted_pts, pts)
        if i < len(sorted_pts) and sorted_pts[i] == pts:
            raise UnsafeStream(f"duplicate pts {pts}")
        sorted_pts.insert(i, pts)
        if packet.is_keyframe:
            if self.key_pos:
                self.max_gop = max(self.max_gop, pts - self.pts[self.key_pos[-1]])
            self.key_pos.append(len(self.packets))
        self.packets.append(packet)
        self.pts.append(pts)
        self.dts.append(dts)
        self.last_dts = dts

    def _demux_past(self, end_pts, past_end):
        """Demux until no later packet can still have a pts in (end_pts, past_end)."""
        for packet in self._packets_iter:
            if not packet.size:
                continue
            pts, dts = packet.pts, packet.dts
            _check(pts, dts)
            self._append(packet, pts, dts)
            if pts > end_pts and (past_end is None or pts < past_end):
                past_end = pts
            if past_end is not None and dts >= past_end:
                return
        self.eof = True

    def adopt(self, other):
        """If `other` (just sought) starts at one of this segment's keyframes, continue this segment
        from `other`'s demuxer (skipping the packets it already holds) instead of keeping two segments
        that would decode the same GOP twice. Returns whether it did."""
        packet = other._next_packet()
        keys = {self.pts[k] for k in self.key_pos}
        if packet is None or not packet.is_keyframe or packet.pts not in keys:
            if packet is not None:
                other._append(packet, packet.pts, packet.dts)
            return False
        i = self.pts.index(packet.pts)
        for expected in self.pts[i + 1:]:
            packet = other._next_packet()
            if packet is None or packet.pts != expected:
                raise UnsafeStream("demuxing again from a keyframe gave other packets")
        self._packets_iter, self.eof = other._packets_iter, other.eof
        return True

    def window(self, start_pts, end_pts):
        """ClipBERT's decoded window: sorted pts in [start, end] plus the first pts past end."""
        j = bisect.bisect_right(self.sorted_pts, end_pts)
        past_end = self.sorted_pts[j] if j < len(self.sorted_pts) else None
        if not self.eof and (past_end is None or self.last_dts < past_end):
            self._demux_past(end_pts, past_end)
        i = bisect.bisect_left(self.sorted_pts, start_pts)
        j = bisect.bisect_right(self.sorted_pts, end_pts)
        return self.sorted_pts[i:min(j + 1, len(self.sorted_pts))]

    def reaches(self, start_pts, index=None):
        """Whether continuing to demux this segment is no more work than seeking for start_pts.
        `index` (the mov demuxer's stream index, whose timestamps are the packets' dts): also when no
        keyframe follows this segment's last one before the seek point, i.e. where the seek would land
        on a keyframe the segment holds and :meth:`adopt` would continue it after demuxing that GOP
        again (the mov seek looks for the keyframe with dts <= the pts asked minus the stream's
        dts shift, at or before the one this finds)."""
        if self.eof or self.last_dts is None:
            return self.eof
        seek_pts = max(start_pts - SEEK_MARGIN, 0)
        if seek_pts <= self.last_dts + self.max_gop:
            return True
        if not index or not self.key_pos:
            return False
        j = index.search_timestamp(self.dts[self.key_pos[-1]] + 1, backward=False)
        return j < 0 or index[j].timestamp > seek_pts


def _mov_index(container):
    """The video stream's index where its timestamps are the packets' dts (the mov/mp4 demuxer), else None."""
    if not {"mov", "mp4"} & set(container.format.name.split(",")):  # "mp4" where opened with format="mp4"
        return None
    return container.streams.video[0].index_entries


def scan_windows(container, windows):
    """windows: [(start_pts, end_pts)] -> ([Segment], [(segment number, window pts list)] per window).

    Windows are served in start order; a window close enough to the previous one continues its
    segment instead of seeking (the packets it sees are then a superset of the reference's, the same
    ones for any stream whose frames after a keyframe in decode order are not shown before it)."""
    segments, out = [], [None] * len(windows)
    index = _mov_index(container)
    for k in sorted(range(len(windows)), key=lambda k: windows[k][0]):
        start_pts, end_pts = windows[k]
        if not segments or not segments[-1].reaches(start_pts, index):
            seg = Segment(container, max(start_pts - SEEK_MARGIN, 0))
            if not segments or not segments[-1].adopt(seg):
                segments.append(seg)
        out[k] = (len(segments) - 1, segments[-1].window(start_pts, end_pts))
    return segments, out


def _set_skip(cc, state, value):
    if state[0] != value:
        cc.skip_frame = value
        state[0] = value


def _last_before_jump(seg, targets, n):
    """Whether the n-th target is the last one decoded before a jump to a later keyframe (or the last)."""
    if n + 1 == len(targets):
        return True
    return seg.key_pos[bisect.bisect_right(seg.key_pos, targets[n + 1]) - 1] > targets[n]


def decode_segment(cc, seg, wanted, convert):
    """Decode the frames of `seg` whose pts are in `wanted` -> {pts: convert(frame)} (missing ones
    did not come out). Each wanted frame is decoded from the last keyframe before it in decode order.
    After the last frame before a jump (or the last of all), the decoder is drained instead of fed the
    next packets until the frame comes out of its reordering delay: those packets are often reference
    frames it would decode for nothing (a frame's pixels never depend on later packets)."""
    pos = {p: i for i, p in enumerate(seg.pts)}
    targets = sorted(pos[p] for p in set(wanted) if p in pos)
    need, got = {seg.pts[t] for t in targets}, {}
    can_skip = "FRAME" not in str(cc.thread_type)
    skip, fed, drained = [None], None, False
    try:
        for n, t in enumerate(targets):
            k = bisect.bisect_right(seg.key_pos, t) - 1
            if k < 0:
                break  # no keyframe before this frame in the segment
            if fed is None or seg.key_pos[k] > fed or drained:  # jump ahead in memory, no seek
                cc.flush_buffers()
                fed, drained = seg.key_pos[k] - 1, False
            drain_after = _last_before_jump(seg, targets, n)
            while seg.pts[t] not in got and not drained:
                if drain_after and fed >= t:
                    packet = None  # the frame's packet is in: drain instead of feeding later packets
                else:
                    fed += 1
                    packet = seg.packets[fed] if fed < len(seg.packets) else None
                if packet is not None and can_skip:
                    _set_skip(cc, skip, "DEFAULT" if seg.pts[fed] in need else "NONREF")
                drained = packet is None
                for frame in cc.decode(packet):
                    pts = frame.pts
                    if pts in need and pts not in got:
                        got[pts] = convert(frame)
    finally:
        if can_skip:
            cc.skip_frame = "DEFAULT"
    return got


def tail_max_pts(container):
    """Largest packet pts from the last keyframe to the end (a lower bound of the stream's max pts)."""
    stream = container.streams.video[0]
    target = (stream.start_time or 0) + (stream.duration or 0)
    container.seek(target, any_frame=False, backward=True, stream=stream)
    return max((p.pts for p in container.demux(stream) if p.pts is not None), default=0)


def last_packet_pts(container):
    """The pts of the packet an any-frame seek to the stream's end lands on (None if none): one packet,
    a lower bound of the stream's max pts."""
    stream = container.streams.video[0]
    target = (stream.start_time or 0) + (stream.duration or 0)
    container.seek(target, any_frame=True, backward=True, stream=stream)
    return next((p.pts for p in container.demux(stream) if p.pts is not None), None)
