"""perflab.loading.datasets: the built data, the storage formats, and loaders that are correct with
workers (every sample once per epoch, augmentation that differs across workers and epochs) under
every start method. Tiny data and two workers, so the whole file runs in seconds."""

import json
import pickle
from collections import Counter

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import BatchSampler, DataLoader, SequentialSampler

from perflab.loading import datasets as ds

METHODS = ["fork", "spawn", "forkserver"]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return ds.make_jpeg_folder(24, size=(64, 48), root=tmp_path_factory.mktemp("jpegs"))


@pytest.fixture(scope="module")
def files(folder):
    return sorted(folder.glob("*.jpg"))


def test_jpeg_folder_holds_n_real_jpegs_of_the_asked_size(folder, files):
    from PIL import Image

    assert len(files) == 24 and (folder / "DONE").exists()
    sizes = {Image.open(f).size for f in files}
    assert sizes <= {(64, 48), (48, 64)} and (64, 48) in sizes
    assert all(Image.open(f).format == "JPEG" for f in files)
    labels = ds.JpegFolder(folder).labels
    assert set(labels) <= set(range(len(ds.source_photos())))
    # a second call reuses the folder instead of rebuilding it
    mtime = files[0].stat().st_mtime_ns
    ds.make_jpeg_folder(24, size=(64, 48), root=folder)
    assert files[0].stat().st_mtime_ns == mtime


def test_bad_arguments_raise_naming_the_argument(tmp_path):
    with pytest.raises(ValueError, match="n must"):
        ds.make_jpeg_folder(0, root=tmp_path)
    with pytest.raises(ValueError, match="quality"):
        ds.make_jpeg_folder(2, quality=100, root=tmp_path)
    with pytest.raises(ValueError, match="side"):
        ds.decode_resized(b"", 0)
    with pytest.raises(ValueError, match="batch must be uint8"):
        ds.gpu_augment(torch.zeros(2, 3, 8, 8), 4)
    with pytest.raises(ValueError, match="vocab_size"):
        ds.text_corpus(vocab_size=70000, folder=tmp_path)


@pytest.mark.parametrize("method", METHODS)
def test_map_style_loader_sees_each_sample_once_and_draws_differ_across_workers(method):
    loader = DataLoader(ds.RandomProbe(16), batch_size=2, shuffle=True, num_workers=2,
                        multiprocessing_context=method, worker_init_fn=ds.seed_worker,
                        generator=torch.Generator().manual_seed(0))
    rows = [r for batch in loader for r in zip(*[t.tolist() for t in batch])]
    assert Counter(r[0] for r in rows) == Counter(range(16))       # exactly once per epoch
    assert {r[1] for r in rows} == {0, 1}                           # both workers worked
    assert len({r[2] for r in rows}) == 16                          # torch draws all differ
    assert len({r[3] for r in rows}) == 16                          # NumPy draws all differ


def test_without_seed_worker_workers_repeat_the_datasets_numpy_draws():
    loader = DataLoader(ds.RandomProbe(8), batch_size=1, num_workers=2,
                        multiprocessing_context="fork")
    by_worker = {0: [], 1: []}
    for i, w, _, npd in loader:
        by_worker[int(w)].append(float(npd))
    # both workers got a copy of the dataset's one NumPy Generator: the same "random" sequence
    assert by_worker[0] == by_worker[1]


@pytest.mark.parametrize("persistent", [False, True])
def test_augmentation_differs_across_epochs(persistent):
    loader = DataLoader(ds.RandomProbe(8), batch_size=4, num_workers=2,
                        persistent_workers=persistent, worker_init_fn=ds.seed_worker,
                        generator=torch.Generator().manual_seed(1))
    epochs = [{int(i): (t, n) for b in loader for i, _, t, n in zip(*b)} for _ in range(2)]
    for i in range(8):
        assert epochs[0][i][0] != epochs[1][i][0] and epochs[0][i][1] != epochs[1][i][1]


def test_same_generator_seed_gives_the_same_epoch():
    def draws(seed):
        loader = DataLoader(ds.RandomProbe(8), batch_size=4, num_workers=2, shuffle=True,
                            worker_init_fn=ds.seed_worker,
                            generator=torch.Generator().manual_seed(seed))
        return [tuple(map(float, b[2])) for b in loader]
    assert draws(3) == draws(3) != draws(4)


def test_tar_shards_split_across_workers_each_sample_once(files, tmp_path, method="fork"):
    shards = ds.write_tar_shards(files, tmp_path, per_shard=5)
    assert len(shards) == 5
    data = ds.TarShards(shards, transform=len, shuffle=True)
    loader = DataLoader(data, batch_size=3, num_workers=2, multiprocessing_context=method)
    labels = [int(y) for _, ys in loader for y in ys]
    sizes = sorted(int(s) for xs, _ in loader for s in xs)
    assert len(labels) == 24
    assert sizes == sorted(f.stat().st_size for f in files)   # every file once, bytes intact


def test_memmap_matches_decoding_and_reads_a_batch_per_call(files, tmp_path):
    path = ds.write_memmap(files, tmp_path / "imgs.u8", side=16)
    assert path.stat().st_size == 24 * 16 * 16 * 3
    mm = ds.MemmapImages(path)
    x, y = mm[[5, 2, 9]]
    assert x.shape == (3, 3, 16, 16) and x.dtype == torch.uint8
    want = np.stack([ds.decode_resized(files[i], 16) for i in (2, 5, 9)])  # sorted order
    assert torch.equal(x, torch.from_numpy(want).permute(0, 3, 1, 2))
    assert y.tolist() == [ds.JpegFolder(files=files).labels[i] for i in (2, 5, 9)]
    one, label = mm[7]
    assert one.shape == (3, 16, 16) and isinstance(label, int)
    mm[0]
    assert pickle.loads(pickle.dumps(mm))._mm is None  # workers reopen the map themselves
    loader = DataLoader(mm, batch_size=None, num_workers=2, multiprocessing_context="fork",
                        sampler=BatchSampler(SequentialSampler(mm), 5, drop_last=False))
    assert sorted(torch.cat([b[1] for b in loader]).tolist()) == sorted(mm.labels.tolist())


def test_read_rate_counts_items_of_each_format(files, tmp_path):
    mm = ds.MemmapImages(ds.write_memmap(files, tmp_path / "m.u8", side=8))
    for data in (ds.JpegFolder(files=files), mm,
                 ds.TarShards(ds.write_tar_shards(files, tmp_path / "t", 8))):
        assert ds.read_rate(data, n=10) > 0
    with pytest.raises(ValueError, match="n=99"):
        ds.read_rate(mm, n=99)


def test_gpu_augment_crops_flips_and_normalizes_on_the_cpu():
    mean = torch.tensor(ds.IMAGENET_MEAN).view(1, 3, 1, 1) * 255
    flat = mean.round().to(torch.uint8).expand(2, 3, 20, 30).contiguous()
    out = ds.gpu_augment(flat, 8, generator=torch.Generator().manual_seed(0))
    assert out.shape == (2, 3, 8, 8) and out.dtype == torch.float32
    assert out.abs().max() < 0.02                      # the mean colour normalizes to ~0
    ramp = torch.arange(32, dtype=torch.uint8).repeat(1, 3, 32, 1) * 8   # brighter to the right
    full = ds.gpu_augment(ramp, 16, scale=(1, 1), flip=False)
    std = torch.tensor(ds.IMAGENET_STD).view(1, 3, 1, 1) * 255
    want = (F.interpolate(ramp.float(), size=(16, 16), mode="bilinear") - mean) / std
    assert torch.allclose(full, want, atol=1e-4)       # whole image, no flip: a plain resize
    draws = ds.gpu_augment(ramp.expand(64, 3, 32, 32), 16, scale=(1, 1),
                           generator=torch.Generator().manual_seed(0))
    slope = draws[:, 0, :, -1].mean(1) - draws[:, 0, :, 0].mean(1)
    assert 10 < int((slope < 0).sum()) < 54             # about half the images were flipped


def test_gpu_augment_list_matches_the_batched_version_and_keeps_images_apart():
    g = torch.Generator().manual_seed(0)
    pics = torch.randint(0, 256, (6, 3, 24, 40), dtype=torch.uint8, generator=g)
    same = ds.gpu_augment(pics, 12, generator=torch.Generator().manual_seed(3))
    listed = ds.gpu_augment_list(list(pics), 12, generator=torch.Generator().manual_seed(3))
    assert listed.shape == (6, 3, 12, 12) and listed.dtype == torch.float32
    assert torch.allclose(listed, same, atol=1e-3)      # same crops, flips and bilinear weights
    # images of different sizes: each output is sampled from its own pixels only
    mean = torch.tensor(ds.IMAGENET_MEAN).view(1, 3, 1, 1) * 255
    std = torch.tensor(ds.IMAGENET_STD).view(1, 3, 1, 1) * 255
    sizes = [(10, 12), (16, 8), (5, 31), (40, 40)]
    imgs = [torch.full((3, hh, ww), 50 * k + 10, dtype=torch.uint8)
            for k, (hh, ww) in enumerate(sizes)]
    out = ds.gpu_augment_list(imgs, 9, generator=torch.Generator().manual_seed(1))
    want = ((torch.tensor([10.0, 60, 110, 160]).view(4, 1, 1, 1) - mean) / std).expand_as(out)
    assert torch.allclose(out, want, atol=1e-4)
    # a whole-image crop without a flip is a plain bilinear resize
    ramp = torch.arange(20, dtype=torch.uint8).repeat(3, 20, 1) * 12
    full = ds.gpu_augment_list([ramp], 16, scale=(1, 1), flip=False)
    assert torch.allclose(full, (F.interpolate(ramp[None].float(), size=(16, 16),
                                               mode="bilinear") - mean) / std, atol=1e-3)
    with pytest.raises(ValueError, match="images is empty"):
        ds.gpu_augment_list([], 8)
    with pytest.raises(ValueError, match=r"images\[1\]"):
        ds.gpu_augment_list([ramp, ramp.float()], 8)


def test_pil_pipeline_is_seeded_by_torch(files):
    a = ds.pil_pipeline(files[0], 32, generator=torch.Generator().manual_seed(5))
    b = ds.pil_pipeline(files[0], 32, generator=torch.Generator().manual_seed(5))
    c = ds.pil_pipeline(files[0], 32, generator=torch.Generator().manual_seed(6))
    assert a.shape == (3, 32, 32) and torch.equal(a, b) and not torch.equal(a, c)


def test_worker_thread_counts_sees_an_oversubscribing_init():
    assert ds.worker_thread_counts(2) == {0: 1, 1: 1}    # DataLoader's own default
    assert ds.worker_thread_counts(2, worker_init_fn=_two_threads) == {0: 2, 1: 2}
    assert ds.worker_thread_counts(2, worker_init_fn=_two_then_seed) == {0: 1, 1: 1}


def _two_threads(worker_id):
    torch.set_num_threads(2)


def _two_then_seed(worker_id):
    torch.set_num_threads(2)
    ds.seed_worker(worker_id)


def test_cpu_rate_and_training_ladder_run_on_the_cpu(folder, files, tmp_path):
    blobs = ds.read_blobs(files[:8])
    assert ds.cpu_rate(blobs, "decode", num_workers=0, batch=2)["images"] == 6
    assert ds.cpu_rate(blobs, "pipeline", num_workers=0, batch=2)["images_per_s"] > 0
    mm = ds.write_memmap(files, tmp_path / "l.u8", side=40)
    rungs = ds.ladder_loaders(folder, mm, batch=4, workers=1, out=32)
    assert list(rungs) == ["naive", "workers", "pinned", "memmap_gpu_aug"]
    model = ds.small_cnn(width=4)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny convolutions: threads would only contend on a busy machine
    try:
        for name in ("naive", "memmap_gpu_aug"):
            loader, tf = rungs[name]
            r = ds.train_steps(loader, model, steps=2, device="cpu", gpu_transform=tf, warmup=1)
            assert 0 < r["data_wait_fraction"] < 1 and r["images_per_s"] > 0
    finally:
        torch.set_num_threads(threads)
    # epochs: the loaders draw several passes over the data
    twice = ds.ladder_loaders(folder, mm, batch=4, workers=1, out=32, epochs=2)
    loader, _ = twice["naive"]
    assert len(loader) == 2 * len(rungs["naive"][0])
    with pytest.raises(ValueError, match="epochs"):
        ds.ladder_loaders(folder, mm, batch=4, workers=1, epochs=0)
    assert ds.small_cnn_flops(4, 32) > 0
    x = torch.zeros(1, 3, 128, 128)
    assert ds.small_cnn(8)(x).shape == (1, 10)


def test_stdlib_sources_are_cleaned():
    docs = ds.stdlib_sources(max_bytes=300_000)
    texts = [t for _, t in docs]
    assert len(set(texts)) == len(texts) and all(len(t) >= 200 for t in texts)
    assert not any("site-packages" in p for p, _ in docs)
    assert sum(len(t.encode()) for t in texts) >= 300_000


def test_text_corpus_tokenizes_once_into_uint16(tmp_path):
    c = ds.text_corpus(max_bytes=100_000, vocab_size=400, train_bytes=50_000, folder=tmp_path)
    assert c.vocab_size == 400 and c.tokens.stat().st_size == 2 * c.n_tokens
    toks = c.array()
    assert toks.dtype == np.uint16 and int(toks.max()) < 400
    assert (toks == 0).sum() == c.n_files                    # one <|endoftext|> per file
    tok = c.load_tokenizer()
    first = ds.stdlib_sources(max_bytes=1)[0][1]
    ids = tok.encode(first).ids
    assert toks[: len(ids)].tolist() == ids and tok.decode(ids) == first
    again = ds.text_corpus(max_bytes=100_000, vocab_size=400, train_bytes=50_000, folder=tmp_path)
    assert again == c and json.loads((tmp_path / "meta.json").read_text())["n_files"] == c.n_files
    data = ds.TokenDataset(c, seq_len=16)
    x, y = data[3]
    assert x.dtype == torch.int64 and x.shape == (16,) and torch.equal(x[1:], y[:-1])
    assert len(data) == (c.n_tokens - 1) // 16
    with pytest.raises(IndexError):
        data[len(data)]
    loader = DataLoader(data, batch_size=8, num_workers=2, multiprocessing_context="fork")
    xb, yb = next(iter(loader))
    assert xb.shape == (8, 16) and torch.equal(xb[0], data[0][0])


def test_parallel_decode_rate_counts_every_image(files):
    one = ds.parallel_decode_rate(files[:8], 1, side=32)
    two = ds.parallel_decode_rate(files[:8], 2, side=32)
    assert one > 0 and two > 0
    with pytest.raises(ValueError, match="processes"):
        ds.parallel_decode_rate(files[:8], 0)
    with pytest.raises(ValueError, match="at least processes=9"):
        ds.parallel_decode_rate(files[:8], 9)
