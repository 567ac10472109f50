"""file2lmdb re-encoding (--fps/--short_side/--max_seconds/--crf): the stored videos decoded and
checked (codec, pixel format, size, frame count, timestamps), failures counted and listed, resume,
the summary and the progress lines."""
import io
import os

import av
import lmdb
import numpy as np
import pytest

from clipbert_legacy.preprocessing import file2lmdb
from clipbert_legacy.preprocessing.make_demo_data import encode_mp4, render_video
from clipbert_legacy.preprocessing.video_compress import CompressSettings, compress_video, output_size


def _write(path, data):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)


def _wide(n_frames=60, fps=30):
    """158x98 (w x h), `fps` frames per second."""
    frames = render_video("red", "square", "left", seed=0, size=98, n_frames=n_frames)
    return encode_mp4(np.pad(frames, ((0, 0), (0, 0), (30, 30), (0, 0))), fps=fps)


def _stored(path):
    """{key: value} of a store, the env closed again (file2lmdb reopens it for writing)."""
    env = lmdb.open(str(path), readonly=True, lock=False)
    with env.begin() as txn:
        out = {k.decode(): bytes(v) for k, v in txn.cursor()}
    env.close()
    return out


def _probe(data):
    with av.open(io.BytesIO(data)) as c:
        s = c.streams.video[0]
        frames = list(c.decode(video=0))
        return {"codec": s.codec_context.name, "size": (s.width, s.height), "pix_fmt": frames[0].format.name,
                "times": [round(f.time, 3) for f in frames]}


@pytest.fixture()
def raw(tmp_path):
    root = tmp_path / "videos"
    _write(str(root / "wide.mp4"), _wide())
    _write(str(root / "sub" / "small.mp4"),
           encode_mp4(render_video("blue", "circle", "up", seed=1, size=32, n_frames=20), fps=10))
    _write(str(root / "broken.mp4"), b"not a video" * 20)
    _write(str(root / "empty.mp4"), b"")
    return root


def test_output_size_even_and_never_upscaled():
    assert output_size(320, 240, 224) == (298, 224)
    assert output_size(157, 97) == (156, 96)
    assert output_size(100, 50, 224) == (100, 50)
    assert output_size(240, 320, 120) == (120, 160)


def test_compress_video_frames_fps_size():
    out = compress_video(_wide(), CompressSettings(fps=3, short_side=40, max_seconds=1.5))
    assert _probe(out) == {"codec": "h264", "size": (64, 40), "pix_fmt": "yuv420p",
                           "times": [0.0, 0.333, 0.667, 1.0, 1.333]}
    same = compress_video(_wide(n_frames=12), CompressSettings(crf=30))
    assert _probe(same) == {"codec": "h264", "size": (158, 98), "pix_fmt": "yuv420p",
                            "times": [round(i / 30, 3) for i in range(12)]}
    slow = compress_video(_wide(n_frames=4, fps=2), CompressSettings(fps=3))  # source slower: no duplicates
    assert _probe(slow)["times"] == [0.0, 0.667, 1.0, 1.333]  # 0, .5, 1, 1.5 s to the nearest 1/3 s
    with pytest.raises(av.error.InvalidDataError):
        compress_video(b"garbage" * 10, CompressSettings(fps=3))


def test_cli_compresses_counts_failures_and_resumes(raw, tmp_path, capsys):
    out = tmp_path / "db"
    args = ["--data_root", str(raw), "--lmdb_save_dir", str(out), "--fps", "3", "--short_side", "40",
            "--max_seconds", "1.5", "--num_workers", "2"]
    assert file2lmdb.main(args) == 1
    text = capsys.readouterr().out
    store = _stored(out)
    assert sorted(store) == ["small", "wide"]
    assert _probe(store["wide"]) == {"codec": "h264", "size": (64, 40), "pix_fmt": "yuv420p",
                                         "times": [0.0, 0.333, 0.667, 1.0, 1.333]}
    assert _probe(store["small"]) == {"codec": "h264", "size": (32, 32), "pix_fmt": "yuv420p",
                                          "times": [0.0, 0.333, 0.667, 1.0, 1.333]}
    size_in = sum(os.path.getsize(p) for p in file2lmdb.collect_files(str(raw), ["mp4"]))
    size_out = len(store["wide"]) + len(store["small"])
    assert "wrote 2 video files" in text and "; 2 failed" in text
    assert "video files: 4 found, 0 already stored (skipped), 2 written, 2 failed" in text
    assert f"bytes in {size_in / 2 ** 20:.1f} MB -> stored {size_out / 2 ** 20:.1f} MB" in text
    assert f"failed: {raw / 'empty.mp4'}: 0 bytes" in text and f"failed: {raw / 'broken.mp4'}: " in text
    assert "file2lmdb: 4/4 files, " in text and " ETA " in text  # plain progress line: no terminal
    assert sorted(line.split("\t")[0] for line in (out / "error_filepaths.log").read_text().splitlines()) == [
        str(raw / "broken.mp4"), str(raw / "empty.mp4")]
    # resume: stored keys skipped, the new file added, the bad ones tried (and reported) again
    _write(str(raw / "new.mp4"), _wide(n_frames=9))
    assert file2lmdb.main(args + ["--resume"]) == 1
    text = capsys.readouterr().out
    assert "video files: 5 found, 2 already stored (skipped), 1 written, 2 failed" in text
    assert sorted(_stored(out)) == ["new", "small", "wide"]
    # resume with other settings is refused; without --resume the directory must be empty
    assert file2lmdb.main(args[:-6] + ["--fps", "2", "--resume"]) == 2
    assert "was built with compression" in capsys.readouterr().err
    assert file2lmdb.main(args) == 2
    assert "--resume" in capsys.readouterr().err


def test_bad_options_and_images(raw, tmp_path, capsys):
    with pytest.raises(SystemExit):
        file2lmdb.main(["--data_root", str(raw), "--lmdb_save_dir", str(tmp_path / "a"), "--fps", "0"])
    assert "--fps must be > 0" in capsys.readouterr().err
    assert file2lmdb.main(["--data_root", str(raw), "--lmdb_save_dir", str(tmp_path / "b"), "--crf", "20",
                           "--file_type", "image", "--ext", "mp4"]) == 2
    assert "not for --file_type image" in capsys.readouterr().err
