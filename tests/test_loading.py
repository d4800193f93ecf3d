"""perflab.loading: the built data, the storage formats, and loaders that are correct with
workers (every sample once per epoch, augmentation that differs across workers and epochs) under
every start method. Tiny data and two workers, so the whole file runs in seconds."""

import json
import pickle
import threading
import time
from collections import Counter

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import BatchSampler, DataLoader, SequentialSampler

from perflab.core.timing import window_listener
from perflab.loading import datasets, loaders, measure, storage, training, transforms

METHODS = ["fork", "spawn", "forkserver"]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return datasets.make_jpeg_folder(24, size=(64, 48), root=tmp_path_factory.mktemp("jpegs"))


@pytest.fixture(scope="module")
def files(folder):
    return sorted(folder.glob("*.jpg"))


def test_jpeg_folder_holds_n_real_jpegs_of_the_asked_size(folder, files):
    from PIL import Image

    assert len(files) == 24 and (folder / "DONE").exists()
    sizes = {Image.open(f).size for f in files}
    assert sizes <= {(64, 48), (48, 64)} and (64, 48) in sizes
    assert all(Image.open(f).format == "JPEG" for f in files)
    labels = storage.JpegFolder(folder).labels
    assert set(labels) <= set(range(len(datasets.source_photos())))
    # a second call reuses the folder instead of rebuilding it
    mtime = files[0].stat().st_mtime_ns
    datasets.make_jpeg_folder(24, size=(64, 48), root=folder)
    assert files[0].stat().st_mtime_ns == mtime


def test_bad_arguments_raise_naming_the_argument(tmp_path):
    with pytest.raises(ValueError, match="n must"):
        datasets.make_jpeg_folder(0, root=tmp_path)
    with pytest.raises(ValueError, match="quality"):
        datasets.make_jpeg_folder(2, quality=100, root=tmp_path)
    with pytest.raises(ValueError, match="side"):
        transforms.decode_resized(b"", 0)
    with pytest.raises(ValueError, match="batch must be uint8"):
        transforms.gpu_augment(torch.zeros(2, 3, 8, 8), 4)
    with pytest.raises(ValueError, match="vocab_size"):
        datasets.text_corpus(vocab_size=70000, folder=tmp_path)


@pytest.mark.parametrize("method", METHODS)
def test_map_style_loader_sees_each_sample_once_and_draws_differ_across_workers(method):
    loader = DataLoader(loaders.RandomProbe(16), batch_size=2, shuffle=True, num_workers=2,
                        multiprocessing_context=method, worker_init_fn=loaders.seed_worker,
                        generator=torch.Generator().manual_seed(0))
    rows = [r for batch in loader for r in zip(*[t.tolist() for t in batch])]
    assert Counter(r[0] for r in rows) == Counter(range(16))       # exactly once per epoch
    assert {r[1] for r in rows} == {0, 1}                           # both workers worked
    assert len({r[2] for r in rows}) == 16                          # torch draws all differ
    assert len({r[3] for r in rows}) == 16                          # NumPy draws all differ


def test_without_seed_worker_workers_repeat_the_datasets_numpy_draws():
    loader = DataLoader(loaders.RandomProbe(8), batch_size=1, num_workers=2,
                        multiprocessing_context="fork")
    by_worker = {0: [], 1: []}
    for i, w, _, npd in loader:
        by_worker[int(w)].append(float(npd))
    # both workers got a copy of the dataset's one NumPy Generator: the same "random" sequence
    assert by_worker[0] == by_worker[1]


@pytest.mark.parametrize("persistent", [False, True])
def test_augmentation_differs_across_epochs(persistent):
    loader = DataLoader(loaders.RandomProbe(8), batch_size=4, num_workers=2,
                        persistent_workers=persistent, worker_init_fn=loaders.seed_worker,
                        generator=torch.Generator().manual_seed(1))
    epochs = [{int(i): (t, n) for b in loader for i, _, t, n in zip(*b)} for _ in range(2)]
    for i in range(8):
        assert epochs[0][i][0] != epochs[1][i][0] and epochs[0][i][1] != epochs[1][i][1]


def test_same_generator_seed_gives_the_same_epoch():
    def draws(seed):
        loader = DataLoader(loaders.RandomProbe(8), batch_size=4, num_workers=2, shuffle=True,
                            worker_init_fn=loaders.seed_worker,
                            generator=torch.Generator().manual_seed(seed))
        return [tuple(map(float, b[2])) for b in loader]
    assert draws(3) == draws(3) != draws(4)


def test_tar_shards_split_across_workers_each_sample_once(files, tmp_path, method="fork"):
    shards = storage.write_tar_shards(files, tmp_path, per_shard=5)
    assert len(shards) == 5
    data = storage.TarShards(shards, transform=len, shuffle=True)
    loader = DataLoader(data, batch_size=3, num_workers=2, multiprocessing_context=method)
    labels = [int(y) for _, ys in loader for y in ys]
    sizes = sorted(int(s) for xs, _ in loader for s in xs)
    assert len(labels) == 24
    assert sizes == sorted(f.stat().st_size for f in files)   # every file once, bytes intact
    assert sorted(labels) == sorted(storage.JpegFolder(files=files).labels)


def test_tar_shards_have_the_webdataset_layout(files, tmp_path):
    import tarfile

    shard = storage.write_tar_shards(files[:3], tmp_path, per_shard=5)[0]
    with tarfile.open(shard) as tar:
        names = tar.getnames()
        label = tar.extractfile(f"{files[0].stem}.cls").read()
    # one sample = consecutive members sharing a key: key.jpg, key.cls
    assert names == [f"{f.stem}.{ext}" for f in files[:3] for ext in ("jpg", "cls")]
    assert int(label) == storage.JpegFolder(files=files).labels[0]


def test_memmap_matches_decoding_and_reads_a_batch_per_call(files, tmp_path):
    path = storage.write_memmap(files, tmp_path / "imgs.u8", side=16)
    assert path.stat().st_size == 24 * 16 * 16 * 3
    mm = storage.MemmapImages(path)
    x, y = mm[[5, 2, 9]]
    assert x.shape == (3, 3, 16, 16) and x.dtype == torch.uint8
    want = np.stack([transforms.decode_resized(files[i], 16) for i in (2, 5, 9)])  # sorted order
    assert torch.equal(x, torch.from_numpy(want).permute(0, 3, 1, 2))
    assert y.tolist() == [storage.JpegFolder(files=files).labels[i] for i in (2, 5, 9)]
    one, label = mm[7]
    assert one.shape == (3, 16, 16) and isinstance(label, int)
    mm[0]
    assert pickle.loads(pickle.dumps(mm))._mm is None  # workers reopen the map themselves
    loader = DataLoader(mm, batch_size=None, num_workers=2, multiprocessing_context="fork",
                        sampler=BatchSampler(SequentialSampler(mm), 5, drop_last=False))
    assert sorted(torch.cat([b[1] for b in loader]).tolist()) == sorted(mm.labels.tolist())



def test_memmap_json_is_removed_before_a_rewrite_and_appears_whole(files, tmp_path, monkeypatch):
    """A reader takes the .json as proof of a complete map (chapter 5's ladder): a rewrite that
    stops midway must leave none behind, and a finished one leaves no temporary file."""
    path = storage.write_memmap(files, tmp_path / "m.u8", side=8)
    meta = tmp_path / "m.u8.json"
    assert json.loads(meta.read_text())["shape"] == [24, 8, 8, 3]
    decoded = []

    def stops(f, side):
        if len(decoded) == 5:
            raise KeyboardInterrupt("the run stopped mid-write")
        decoded.append(f)
        return transforms.decode_resized(f, side)

    monkeypatch.setattr(storage, "decode_resized", stops)
    with pytest.raises(KeyboardInterrupt):
        storage.write_memmap(files, path, side=16)
    assert not meta.exists()                      # the old one went before the map was opened
    monkeypatch.undo()
    storage.write_memmap(files, path, side=16)
    assert json.loads(meta.read_text())["shape"] == [24, 16, 16, 3]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.u8", "m.u8.json"]

def test_read_rate_counts_items_of_each_format(files, tmp_path):
    mm = storage.MemmapImages(storage.write_memmap(files, tmp_path / "m.u8", side=8))
    for data in (storage.JpegFolder(files=files), mm,
                 storage.TarShards(storage.write_tar_shards(files, tmp_path / "t", 8))):
        assert measure.read_rate(data, n=10) > 0
    with pytest.raises(ValueError, match="n=99"):
        measure.read_rate(mm, n=99)


def test_memmap_copy_rate_copies_the_read_batches(files, tmp_path, monkeypatch):
    mm = storage.MemmapImages(storage.write_memmap(files, tmp_path / "m.u8", side=8))
    assert mm.array() is mm.array() and mm.array().shape == mm.shape   # one mapping, kept
    keys, copied, real = [], [], mm.array()

    class Recorded:             # the mapping, recording how each batch is indexed
        def __getitem__(self, key):
            keys.append(key)
            copied.append(real[key])
            return copied[-1]

    monkeypatch.setattr(storage.MemmapImages, "array", lambda self: Recorded())
    assert measure.memmap_copy_rate(mm, n=10, batch=4) > 0
    monkeypatch.undo()
    # the read's batches (the last short), each by a fancy index of sorted int64 positions,
    # as MemmapImages.__getitem__ indexes them: the same numpy copy path, not a slice
    assert [k.tolist() for k in keys] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    assert all(isinstance(k, np.ndarray) and k.dtype == np.int64 for k in keys)
    assert all(c.flags.writeable and not np.shares_memory(c, real)        # fresh arrays
               for c in copied)
    want = mm[list(range(10))][0].permute(0, 2, 3, 1).numpy()
    assert (np.concatenate(copied) == want).all()         # the same bytes as the read
    with pytest.raises(ValueError, match="n=99"):
        measure.memmap_copy_rate(mm, n=99)
    with pytest.raises(TypeError, match="MemmapImages"):
        measure.memmap_copy_rate(storage.JpegFolder(files=files))


def test_memmap_wrapper_seconds_reads_the_batches_of_a_one_pixel_twin(files, tmp_path,
                                                                      monkeypatch):
    mm = storage.MemmapImages(storage.write_memmap(files, tmp_path / "m.u8", side=8))
    calls = []
    real = storage.MemmapImages.__getitem__

    def recorded(self, idx):    # every batch the helper reads, and from which map
        calls.append((self.path.name, self.shape, list(idx)))
        return real(self, idx)

    monkeypatch.setattr(storage.MemmapImages, "__getitem__", recorded)
    assert measure.memmap_wrapper_seconds(mm, n=10, batch=4) > 0
    monkeypatch.undo()
    # the read's own batches (the last short) through __getitem__, of a 1 x 1-pixel twin
    assert [c[2] for c in calls] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    assert {c[0] for c in calls} == {"m.u8.1px.u8"}
    assert {c[1] for c in calls} == {(len(files), 1, 1, 3)}
    twin = storage.MemmapImages(tmp_path / "m.u8.1px.u8")
    assert twin.labels.tolist() == mm.labels.tolist()          # the same labels
    with pytest.raises(ValueError, match="n=99"):
        measure.memmap_wrapper_seconds(mm, n=99)
    with pytest.raises(TypeError, match="MemmapImages"):
        measure.memmap_wrapper_seconds(storage.JpegFolder(files=files))


def test_gpu_augment_crops_flips_and_normalizes_on_the_cpu():
    mean = torch.tensor(transforms.IMAGENET_MEAN).view(1, 3, 1, 1) * 255
    flat = mean.round().to(torch.uint8).expand(2, 3, 20, 30).contiguous()
    out = transforms.gpu_augment(flat, 8, generator=torch.Generator().manual_seed(0))
    assert out.shape == (2, 3, 8, 8) and out.dtype == torch.float32
    assert out.abs().max() < 0.02                      # the mean colour normalizes to ~0
    ramp = torch.arange(32, dtype=torch.uint8).repeat(1, 3, 32, 1) * 8   # brighter to the right
    full = transforms.gpu_augment(ramp, 16, scale=(1, 1), flip=False)
    std = torch.tensor(transforms.IMAGENET_STD).view(1, 3, 1, 1) * 255
    want = (F.interpolate(ramp.float(), size=(16, 16), mode="bilinear") - mean) / std
    assert torch.allclose(full, want, atol=1e-4)       # whole image, no flip: a plain resize
    draws = transforms.gpu_augment(ramp.expand(64, 3, 32, 32), 16, scale=(1, 1),
                                   generator=torch.Generator().manual_seed(0))
    slope = draws[:, 0, :, -1].mean(1) - draws[:, 0, :, 0].mean(1)
    assert 10 < int((slope < 0).sum()) < 54             # about half the images were flipped


def test_gpu_augment_list_matches_the_batched_version_and_keeps_images_apart():
    g = torch.Generator().manual_seed(0)
    pics = torch.randint(0, 256, (6, 3, 24, 40), dtype=torch.uint8, generator=g)
    same = transforms.gpu_augment(pics, 12, generator=torch.Generator().manual_seed(3))
    listed = transforms.gpu_augment_list(list(pics), 12, generator=torch.Generator().manual_seed(3))
    assert listed.shape == (6, 3, 12, 12) and listed.dtype == torch.float32
    assert torch.allclose(listed, same, atol=1e-3)      # same crops, flips and bilinear weights
    # images of different sizes: each output is sampled from its own pixels only
    mean = torch.tensor(transforms.IMAGENET_MEAN).view(1, 3, 1, 1) * 255
    std = torch.tensor(transforms.IMAGENET_STD).view(1, 3, 1, 1) * 255
    sizes = [(10, 12), (16, 8), (5, 31), (40, 40)]
    imgs = [torch.full((3, hh, ww), 50 * k + 10, dtype=torch.uint8)
            for k, (hh, ww) in enumerate(sizes)]
    out = transforms.gpu_augment_list(imgs, 9, generator=torch.Generator().manual_seed(1))
    want = ((torch.tensor([10.0, 60, 110, 160]).view(4, 1, 1, 1) - mean) / std).expand_as(out)
    assert torch.allclose(out, want, atol=1e-4)
    # a whole-image crop without a flip is a plain bilinear resize
    ramp = torch.arange(20, dtype=torch.uint8).repeat(3, 20, 1) * 12
    full = transforms.gpu_augment_list([ramp], 16, scale=(1, 1), flip=False)
    assert torch.allclose(full, (F.interpolate(ramp[None].float(), size=(16, 16),
                                               mode="bilinear") - mean) / std, atol=1e-3)
    with pytest.raises(ValueError, match="images is empty"):
        transforms.gpu_augment_list([], 8)
    with pytest.raises(ValueError, match=r"images\[1\]"):
        transforms.gpu_augment_list([ramp, ramp.float()], 8)


def test_pil_pipeline_is_seeded_by_torch(files):
    a = transforms.pil_pipeline(files[0], 32, generator=torch.Generator().manual_seed(5))
    b = transforms.pil_pipeline(files[0], 32, generator=torch.Generator().manual_seed(5))
    c = transforms.pil_pipeline(files[0], 32, generator=torch.Generator().manual_seed(6))
    assert a.shape == (3, 32, 32) and torch.equal(a, b) and not torch.equal(a, c)


def test_worker_thread_counts_sees_an_oversubscribing_init():
    assert loaders.worker_thread_counts(2) == {0: 1, 1: 1}    # DataLoader's own default
    assert loaders.worker_thread_counts(2, worker_init_fn=_two_threads) == {0: 2, 1: 2}
    assert loaders.worker_thread_counts(2, worker_init_fn=_two_then_seed) == {0: 1, 1: 1}


def _two_threads(worker_id):
    torch.set_num_threads(2)


def _two_then_seed(worker_id):
    torch.set_num_threads(2)
    loaders.seed_worker(worker_id)


def test_cpu_rate_and_training_ladder_run_on_the_cpu(folder, files, tmp_path):
    blobs = storage.read_blobs(files[:8])
    # 8 blobs hold (2 + 2) batches of 2: every blob once, the first batch left out
    assert measure.cpu_rate(blobs, "decode", num_workers=0, batch=2, rounds=2)["images"] == 6
    assert measure.cpu_rate(blobs, "decode", num_workers=0, batch=2, collate="packed",
                            rounds=2)["images"] == 6
    assert measure.cpu_rate(blobs, "pipeline", num_workers=0, batch=2,
                            rounds=2)["images_per_s"] > 0
    with pytest.raises(ValueError, match="collate"):
        measure.cpu_rate(blobs, "decode", collate="tuple")
    # fewer blobs than the rounds need (16 cores, 1,024 images, batches of 16 hold 4 rounds):
    # the pass repeats the blobs, and by default times 10 whole rounds (one batch per worker)
    many = measure.cpu_rate(blobs, "decode", num_workers=2, batch=3)
    assert many["batch"] == 3 and many["items"] == (10 + 2) * 2 * 3
    assert many["images"] == 10 * 2 * 3
    with pytest.raises(ValueError, match="batch"):
        measure.cpu_rate(blobs, "decode", num_workers=0, batch=0)
    with pytest.raises(ValueError, match="rounds"):
        measure.cpu_rate(blobs, "decode", num_workers=0, rounds=0)
    # the chapter's rungs: per-image CPU work, and stored squares cropped as a batch
    jpeg = storage.JpegFolder(files=files, transform=transforms.decode_augment)
    x, _ = jpeg[0]
    assert x.shape == (3, 128, 128) and x.dtype == torch.float32
    mm = storage.MemmapImages(storage.write_memmap(files, tmp_path / "l.u8", side=144))
    naive = DataLoader(jpeg, batch_size=4, drop_last=True)
    stored = DataLoader(mm, batch_size=None,
                        sampler=BatchSampler(SequentialSampler(mm), 4, drop_last=True))
    model = measure.small_cnn(width=4)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny convolutions: threads would only contend on a busy machine
    try:
        for loader, tf in ((naive, None), (stored, lambda b: transforms.gpu_augment(b, 128))):
            events = []                      # the timed steps are one window for the samplers
            stop = window_listener(events.append)
            try:
                r = training.train_steps(loader, model, steps=2, device="cpu", gpu_transform=tf,
                                         warmup=1)
            finally:
                stop()
            assert 0 < r["data_wait_fraction"] < 1 and r["images_per_s"] > 0
            assert events == ["open", "close"]
    finally:
        torch.set_num_threads(threads)
    assert measure.small_cnn_flops(4, 32) > 0
    assert measure.small_cnn(8)(torch.zeros(1, 3, 128, 128)).shape == (1, 10)


def test_usable_cores_without_sched_getaffinity(monkeypatch):
    """macOS and Windows have no os.sched_getaffinity: the count falls back to os.cpu_count."""
    import os

    if hasattr(os, "sched_getaffinity"):
        assert loaders.usable_cores() == len(os.sched_getaffinity(0))
        monkeypatch.delattr(os, "sched_getaffinity")
    assert loaders.usable_cores() == (os.cpu_count() or 1)


def test_draft_decoding_scales_in_the_dct(files):
    blob = files[0].read_bytes()
    full = transforms.decode_scaled(blob, 1)
    for k in (2, 4, 8):
        assert transforms.decode_scaled(blob, k).shape == (-(-full.shape[0] // k), -(-full.shape[1] // k), 3)
    with pytest.raises(ValueError, match="scale"):
        transforms.decode_scaled(blob, 3)
    small = transforms.decode_resized(blob, 16, draft=True)
    exact = transforms.decode_resized(blob, 16)
    assert small.shape == exact.shape == (16, 16, 3)
    assert np.abs(small.astype(float) - exact).mean() < 20     # the same picture


def test_packed_batches_round_trip_and_count_as_images(files):
    imgs = [torch.randint(0, 255, (h, w, 3), dtype=torch.uint8) for h, w in ((4, 5), (6, 2))]
    shapes, packed = loaders.collate_packed(imgs)
    assert packed.dim() == 1 and packed.numel() == sum(t.numel() for t in imgs)
    assert all(torch.equal(a, b) for a, b in zip(loaders.unpack(shapes, packed), imgs))
    loader = DataLoader(loaders.ZeroImages(12, (3, 4, 3)), batch_size=3, collate_fn=loaders.collate_packed)
    r = measure.loader_rate(loader, count=lambda b: len(b[0]))
    assert r["images"] == 9                       # 4 batches, the first one untimed


def test_loader_rate_times_the_steady_state():
    data = loaders.ZeroImages(64, (2, 2))
    loader = DataLoader(data, batch_size=4, num_workers=2, multiprocessing_context="fork")
    r = measure.loader_rate(loader)                    # skip a round of 2 at each end: 12 timed
    assert r["images"] == 12 * 4 and r["first_batch_s"] > 0
    assert r["worker_cpu_s"] is None or r["worker_cpu_s"] >= 0
    assert r["worker_window_cpu_s"] is None or 0 <= r["worker_window_cpu_s"] <= r["worker_cpu_s"]
    short = DataLoader(loaders.ZeroImages(16, (2,)), batch_size=4, num_workers=2,
                       multiprocessing_context="fork")
    with pytest.raises(ValueError, match="too few"):
        measure.loader_rate(short)                     # 4 batches: nothing left between the rounds


def test_loader_rate_times_whole_rounds_only():
    """3 workers, 16 batches: a round skipped at each end leaves 10, of which 9 (three whole
    rounds) are timed; 6 batches leave no whole round, which is refused."""
    loader = DataLoader(loaders.ZeroImages(64, (2,)), batch_size=4, num_workers=3,
                        multiprocessing_context="fork")
    assert measure.loader_rate(loader)["images"] == 9 * 4
    short = DataLoader(loaders.ZeroImages(24, (2,)), batch_size=4, num_workers=3,
                       multiprocessing_context="fork")
    with pytest.raises(ValueError, match="one whole round"):
        measure.loader_rate(short)


_LATE_S, _ITEM_S = 0.5, 0.05


class _Sleepy1(torch.utils.data.Dataset):
    """Items that take _ITEM_S each to build, waiting (no CPU): a worker builds at most
    1 / _ITEM_S items per second, however loaded the machine is."""

    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        time.sleep(_ITEM_S)
        return torch.zeros(2)


def _late_half(worker_id):
    """The upper half of 8 workers starts _LATE_S late (ten batches' time): meanwhile the lower
    half builds its prefetched batches of the next round, which wait in the queue."""
    if worker_id >= 4:
        time.sleep(_LATE_S)


def test_loader_rate_never_reads_batches_built_ahead_as_a_rate():
    """Lab 5's 5 Dec failure, with sleeps instead of decoding: 8 workers, 2.5 rounds of
    batches; the timed window was half a round, batches the early workers had built while a
    late worker held up the first round, read in a millisecond (82k images/s against 6k). Now
    such a loader is refused, and one with whole rounds to time reports at most what the
    workers can build (8 workers x 1 / _ITEM_S, less the delay of receiving a batch),
    whichever worker is late."""
    def loader(batches):
        return DataLoader(_Sleepy1(batches), batch_size=1, num_workers=8,
                          worker_init_fn=_late_half, multiprocessing_context="fork")
    with pytest.raises(ValueError, match="one whole round"):
        measure.loader_rate(loader(20))               # 8 skipped, 4 left, 8 skipped
    r = measure.loader_rate(loader(8 * 5))            # 3 whole rounds timed
    assert r["images"] == 3 * 8
    # a quarter of margin: the clock starts when the batch is received, which a loaded machine
    # delays by milliseconds (the fault was 10x and more)
    assert r["images_per_s"] <= 1.25 * 8 / _ITEM_S


class _Sleepy(torch.utils.data.Dataset):
    def __len__(self):
        return 40

    def __getitem__(self, i):
        time.sleep(0.002)                             # waits, burns no CPU
        return torch.zeros(2)


def test_loader_rate_tells_the_receiving_threads_cpu_from_the_processs():
    """main_thread_cpu_s is the calling thread's alone: another thread of the process that
    burns CPU meanwhile (a pin_memory thread, here a spinning one) is in main_cpu_s only."""
    stop = threading.Event()
    spinner = threading.Thread(target=lambda: [None for _ in iter(stop.is_set, True)])
    spinner.start()
    try:
        r = measure.loader_rate(DataLoader(_Sleepy(), batch_size=2))
    finally:
        stop.set()
        spinner.join()
    assert 0 <= r["main_thread_cpu_s"] < 0.5 * r["main_cpu_s"]


def test_raw_reads(files):
    assert measure.raw_read_rate(files[:4]) > 0


def test_stdlib_sources_are_cleaned():
    docs = datasets.stdlib_sources(max_bytes=300_000)
    texts = [t for _, t in docs]
    assert len(set(texts)) == len(texts) and all(len(t) >= 200 for t in texts)
    assert not any("site-packages" in p for p, _ in docs)
    assert sum(len(t.encode()) for t in texts) >= 300_000


def test_text_corpus_tokenizes_once_into_uint16(tmp_path):
    c = datasets.text_corpus(max_bytes=100_000, vocab_size=400, train_bytes=50_000, folder=tmp_path)
    assert c.vocab_size == 400 and c.tokens.stat().st_size == 2 * c.n_tokens
    toks = c.array()
    assert toks.dtype == np.uint16 and int(toks.max()) < 400
    assert (toks == 0).sum() == c.n_files                    # one <|endoftext|> per file
    tok = c.load_tokenizer()
    first = datasets.stdlib_sources(max_bytes=1)[0][1]
    ids = tok.encode(first).ids
    assert toks[: len(ids)].tolist() == ids and tok.decode(ids) == first
    again = datasets.text_corpus(max_bytes=100_000, vocab_size=400, train_bytes=50_000, folder=tmp_path)
    assert again == c and json.loads((tmp_path / "meta.json").read_text())["n_files"] == c.n_files
    data = datasets.TokenDataset(c, seq_len=16)
    x, y = data[3]
    assert x.dtype == torch.int64 and x.shape == (16,) and torch.equal(x[1:], y[:-1])
    assert len(data) == (c.n_tokens - 1) // 16
    with pytest.raises(IndexError):
        data[len(data)]
    loader = DataLoader(data, batch_size=8, num_workers=2, multiprocessing_context="fork")
    xb, yb = next(iter(loader))
    assert xb.shape == (8, 16) and torch.equal(xb[0], data[0][0])


def test_parallel_decode_rate_counts_every_image(files):
    one = measure.parallel_decode_rate(files[:8], 1, side=32)
    two = measure.parallel_decode_rate(files[:8], 2, side=32)
    assert one > 0 and two > 0
    with pytest.raises(ValueError, match="processes"):
        measure.parallel_decode_rate(files[:8], 0)
    with pytest.raises(ValueError, match="at least processes=9"):
        measure.parallel_decode_rate(files[:8], 9)


def _share_of_known_time(args):
    files, _, _ = args   # 5 images in 1 s (0.5 s CPU), 4 images in 2 s (1.3 s CPU)
    return (1.0, 5, 0.5) if len(files) == 5 else (2.0, 4, 1.3)


def test_parallel_decode_rate_sums_the_processes_own_rates(files, monkeypatch):
    # the slowest process's time would give 9 / 2 = 4.5 images/s
    monkeypatch.setattr(measure, "_decode_share", _share_of_known_time)
    assert measure.parallel_decode_rate(files[:9], 2) == pytest.approx(5 + 2)


def test_parallel_decode_reports_cpu_per_image_of_all_processes(files, monkeypatch):
    # CPU, not wall time: (0.5 + 1.3) s over 9 images, not (1 + 2) / 9 or a mean of rates
    monkeypatch.setattr(measure, "_decode_share", _share_of_known_time)
    r = measure.parallel_decode(files[:9], 2)
    assert r["images_per_s"] == pytest.approx(7)
    assert r["cpu_s_per_image"] == pytest.approx(1.8 / 9)


def test_a_bare_process_reports_the_cpu_time_of_its_timed_share(files):
    r = measure.parallel_decode(files[:8], 1, side=32)
    assert 0 < r["cpu_s_per_image"] < 1 / r["images_per_s"] * 1.5 + 0.01


def test_a_bare_process_decodes_one_of_its_files_before_its_clock(monkeypatch):
    events = []

    class Clock:
        seconds = 1.0

        def __enter__(self):
            events.append("clock")
            return self

        def __exit__(self, *exc):
            events.append("stop")

    monkeypatch.setattr(measure, "Stopwatch", Clock)
    monkeypatch.setattr(measure, "decode_resized",
                        lambda f, side: events.append(f))
    seconds, n, cpu = measure._decode_share((["a", "b", "c"], 32, 0.0))
    assert (seconds, n) == (1.0, 3) and cpu >= 0
    assert events == ["a", "clock", "a", "b", "c", "stop"]


def test_kernel_seconds_needs_a_gpu():
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="CUDA"):
            measure.kernel_seconds(lambda: None)


def test_persistent_workers_keep_their_copy_of_the_dataset_and_their_seed():
    """Chapter 5's trap: a change made in the main process after the first epoch reaches fresh
    workers, not persistent ones, and persistent workers' seeds are not drawn again."""
    probe = loaders.EpochProbe(4)
    for persistent, second in ((False, [0, 2, 4, 6]), (True, [0, 1, 2, 3])):
        probe.scale = 1
        loader = DataLoader(probe, batch_size=4, num_workers=1, persistent_workers=persistent,
                            multiprocessing_context="fork")
        (x1, seed1), = list(loader)
        probe.scale = 2
        (x2, seed2), = list(loader)
        assert x1.tolist() == [0, 1, 2, 3] and x2.tolist() == second
        assert (seed1[0] == seed2[0]) == persistent


def test_python_lists_are_copied_into_forked_workers_as_they_read_them():
    """Copy-on-read: reading a Python object writes its reference count, so a worker copies the
    pages of a list's objects it reads; an array's pages stay shared."""
    # Three times each, the least telling run kept: on a loaded machine a worker's private memory
    # also grows now and then for reasons of its own (its allocator's arenas, a huge page
    # collapsed, a collection of the heap it inherited), and a run that meets one of those must
    # not decide. A list that is not copied on read fails the first assert in both runs; an
    # array whose pages are copied fails the second in both.
    runs = [(measure.worker_memory_growth(loaders.IndexList(300_000), num_workers=2),
             measure.worker_memory_growth(loaders.IndexArray(300_000), num_workers=2))
            for _ in range(3)]   # three: the 5 Dec loaded run met noise (10 MB) in two
    if any(v is None for run in runs for v in run):
        pytest.skip("no fork start method or no /proc here")
    listed = max(min(lst) for lst, _ in runs)     # the list's least growth, its better run
    arrayed = min(max(arr) for _, arr in runs)    # the array's most growth, its better run
    assert listed > 16 * 300_000 / 2               # at least a half of its objects' pages
    assert arrayed < 0.25 * listed
    with pytest.raises(ValueError, match="too few"):
        measure.worker_memory_growth(loaders.IndexArray(10), num_workers=2, batch_size=8)


def test_startup_probe_reports_a_workers_phases_on_the_parents_clock():
    from perflab.core.timing import timestamp

    loader = DataLoader(loaders.StartupProbe(_Pairs()), batch_size=2, num_workers=1,
                        worker_init_fn=loaders.startup_init, multiprocessing_context="fork")
    t0 = timestamp()
    *_, phases = next(iter(loader))
    age, init, fetch, kernel, modules, imported, worker = phases[0].tolist()
    assert t0 - 1.0 <= init <= fetch <= timestamp()
    assert modules > 10 and kernel in (0.0, 1.0)
    assert not np.isfinite(age) or 0 <= age <= timestamp() - t0 + 0.02   # 10 ms ticks
    assert np.isnan(imported) and worker == 0      # forked: imported nothing itself


def test_startup_probe_stamps_a_spawned_workers_imports():
    from perflab.core.timing import timestamp

    loader = DataLoader(loaders.StartupProbe(_Pairs()), batch_size=2, num_workers=2,
                        worker_init_fn=loaders.startup_init, multiprocessing_context="spawn")
    t0 = timestamp()
    it = iter(loader)
    batches = [next(it)[-1][0].tolist(), next(it)[-1][0].tolist()]
    del it
    for w, (age, init, fetch, _, _, imported, worker) in enumerate(batches):
        assert worker == w
        assert t0 <= imported <= init <= fetch <= timestamp()     # imports end before init
        assert not np.isfinite(age) or init - age <= imported + 0.02


class _Pairs(torch.utils.data.Dataset):
    def __len__(self):
        return 4

    def __getitem__(self, i):
        return torch.tensor(i), i


def test_spawned_import_seconds_reads_each_childs_own_stamp():
    (one,) = loaders.spawned_import_seconds(processes=1)
    assert np.isfinite(one) and 0 < one < 300   # NaN: the parent's stamp came back
    with pytest.raises(ValueError, match="processes"):
        loaders.spawned_import_seconds(processes=0)
    with pytest.raises(ValueError, match="method"):
        loaders.spawned_import_seconds(method="fork")   # a forked child imports nothing
    with pytest.raises(ValueError, match="timeout"):
        loaders.spawned_import_seconds(timeout=0)


def test_a_loader_read_to_its_end_leaves_no_worker_running(files):
    # chapter 5's start-up cell: a dataset of exactly its two batches, read to its end, so the
    # workers are idle when the loader shuts them down
    loader = DataLoader(loaders.StartupProbe(storage.JpegFolder(files=files[:4])), batch_size=2,
                        num_workers=2, worker_init_fn=loaders.startup_init,
                        multiprocessing_context="fork")
    it = iter(loader)
    *_, p = next(it)
    *_, q = next(it)
    workers = list(it._workers)
    assert next(it, None) is None
    assert all(not w.is_alive() and w.exitcode == 0 for w in workers)
    assert p[0, 6] == 0 and q[0, 6] == 1            # worker 0 built the first batch
