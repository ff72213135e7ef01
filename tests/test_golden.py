"""Golden outputs: the bytes every zoo model gives with its plain sampler and with each accelerated sampler, recorded
before the core was reshaped (issue 15). A refactor that changes any token or pixel fails here.

Each case: 4 samples, labels (0, 3, 7, 12), seed 0, eager, the card's settings (the speculative samplers at the
window the card named when the bytes were recorded, 4: their default, window=auto, picks widths from this machine's
measured pass costs). Hashes are sha256 of the int64
token bytes and of the PNG bytes ``vgen sample`` writes (concatenated over the 4 samples), recorded with Pillow
12.3.0 before the refactor. PNG bytes also depend on the encoder (Pillow and zlib), so the raw uint8 pixels are
pinned too (hashed after the refactor, when the PNG hashes still matched: PNG is lossless, so they are the pixels
of the recorded files); the PNG comparison runs where Pillow is the recorded version."""
import contextlib
import hashlib
import io

import PIL
import pytest
import torch
from guards import needs_zoo
from PIL import Image

import vgen

LABELS = [0, 3, 7, 12]

# (model, sampler, options) -> (sha256 of tokens, sha256 of PNGs)
GOLDEN = {
    ("photos-gpt", None, ()):
        ("e08695066fce7b7c7503fc52158182a1446e3eb9785767158ed264fcd83b89c1",
         "8780e4ebace17ea16ff4cbbb1138391a8892cbcd0594abf4ea94469b7051ba34"),
    ("photos-gpt", "sjd", (("window", 4),)):
        ("3c75326374728cfbda98356c051177818d44754996ab512bc9a9862d3ac36bee",
         "083cfcce3e843502b78117f97465f653cc2fa56cc7a50ae4bc8f41e83cc1b1f7"),
    ("photos-gpt", "gsd", (("window", 4),)):
        ("842d26b4f8680d2c0d9faa3e39c52a1fb313bc36c22bed6dde704efc40f235f5",
         "ac07f60da4652296c853cd2a602eebef6f63327659fbb60bec8f39877b5e8207"),
    ("photos-gpt", "lantern", (("window", 4),)):
        ("0dc369a95e5a78579e8f3bbb7f15aa0a8de0247a4c025dc8eca2888b870efa89",
         "e8eba168891fac537a49498a2168e1fba5b50e61ba0f2490de6028fe4ab5e3c2"),
    ("photos-nar", None, ()):
        ("f036a5fd293eeb26e0bfe66d42ec8bef81932636b16b303c6c6896eba874d109",
         "a524ed67edf34b00a7a173f4f915218e09b99604a1de6e44b0b2e67a847c914b"),
    ("photos-var", None, ()):
        ("bd7a5f4c32c7baac9f64dee76dde9a34b6adcae3970f4d1c293f6fa6f6d64c5b",
         "91a1086dce3ec78de91e7909917b406c1c7cfb32faa51c679983b0d8d2037d3e"),
    ("photos-var", "var", (("kv_compression", "scalekv"), ("kv_budget", 0.1))):
        ("ab0409957294655e90eac800a354f1c020a4090289df29eeb17505703a4dba73",
         "7ab4ba6a7a2cf043f0c78a04ec4eef3ecc1ab27e7dfed7cbf377cea228734492"),
}


PNG_PILLOW = "12.3.0"
PIXELS = {
    ("photos-gpt", None, ()): "f76e7743343f91614509221100d8d70174812b63a889d1763365052243d98170",
    ("photos-gpt", "sjd", (("window", 4),)): "4ea9ea2efff13a6a9e10a48b48a481c00f4fa65ea7524d468830107ce2e3f410",
    ("photos-gpt", "gsd", (("window", 4),)): "2c9cf1a81e0784230b8faecbc5f5a7e7861f5c606775418c4be3c6ff09098745",
    ("photos-gpt", "lantern", (("window", 4),)): "0cc136a56b4e8d10ba041a5d3481d499d8fb40c46f9638b34683c9251977024b",
    ("photos-nar", None, ()): "e1956b60247e77d93831df65fa295861ef9beefb083cee65b76833739a7e5a38",
    ("photos-var", None, ()): "4b0cbf9855dbb8378cfaf511a5ff026dc33820464248beb7437d101c99f6b6d7",
    ("photos-var", "var", (("kv_compression", "scalekv"), ("kv_budget", 0.1))):
        "eab37acf9687bf80d93b0000ead16b4966530139fdd3497faafce418fc6aec3f",
}

# The tables above were recorded on AVX2 hosts. float32 results depend on the kernels MKL, oneDNN and torch pick for
# the CPU, so other kinds of host get tables of their own (:func:`host_class`): the cases whose bytes differ there
# (the others are the bytes above). (tokens, raw pixels, PNG) sha256 per case.
#  - AVX512/AuthenticAMD: recorded 2026-11-25 on an AMD EPYC with AVX-512: the same tokens, the decoders' convolutions
#    round differently (ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2 gave the AVX2
#    bytes there).
#  - AVX512/GenuineIntel: recorded 2026-11-27 on an Intel Xeon with AVX-512 and AMX (edef5e5's code, which passed the
#    tables above on the AVX2 and AMD hosts): photos-var's tokens differ as well (MKL's float32 products round
#    otherwise, and one token flips), and pinning the ISA as above does not give the AVX2 bytes there.
# A CPU family within a class can have entries of its own, keyed by :func:`host_model` (they override the class's).
# On a host of another kind the float32 cases skip (record its table with `python docs/scripts/golden_host.py`);
# the float64 cases below (GOLDEN_F64) hold on every host.
HOST_BYTES = {
    "AVX512/AuthenticAMD": {
        ("photos-gpt", None, ()): ("e08695066fce7b7c7503fc52158182a1446e3eb9785767158ed264fcd83b89c1",
                                   "32616f9800c7dec6425a42c0f1347cfef841cfb3a0187d655a1462951ac7c567",
                                   "fa599a8966497f6f06fd008b18c3fa034ece701058ddaca609e612eb8012ed28"),
        ("photos-nar", None, ()): ("f036a5fd293eeb26e0bfe66d42ec8bef81932636b16b303c6c6896eba874d109",
                                   "d15bcaa92c092ea7ae042e716c31d9909704f6ee1367f8512bfda9e2d05b0063",
                                   "74f46d56d699a0db0be543531731321e4ebcc21ffbbd336eefe647f0eac11471"),
        ("photos-var", None, ()): ("bd7a5f4c32c7baac9f64dee76dde9a34b6adcae3970f4d1c293f6fa6f6d64c5b",
                                   "172a248414dc34d02edc76f9095fa835aaa06446445fc82479170e5fb10e0ec5",
                                   "f77fc979a6fdc13d70716a21694256c9317726dbf67f3660333837e49ccf7e83"),
    },
    "AVX512/GenuineIntel": {
        ('photos-gpt', None, ()):
            ('e08695066fce7b7c7503fc52158182a1446e3eb9785767158ed264fcd83b89c1',
             '83f452770f72bffd854055978afbb0fd93699d4f19206bd89028b2bd906b7d66',
             '608b647f1dc769ef56f533b7aa1becb7b3e677737f22f046a41972a612167ed1'),
        ('photos-nar', None, ()):
            ('f036a5fd293eeb26e0bfe66d42ec8bef81932636b16b303c6c6896eba874d109',
             '2120c0d23354bb3e612ddb6e3ecd39aae4cfc924e9f9b89ebfd54207233d04f5',
             'e4a6d1725469bbe329d593516c8a4528bd405f320dba6689efa02f4705a10626'),
        ('photos-var', None, ()):
            ('0273e65698cfb50c9d80c9e847e6a9e7247e61f6b5ad5cd4b518d286eea9b984',
             'b1d77cd432b24f102269fdc24a9e7b6535378fd81473e37062f77b12e3919e2f',
             '3421deb1a35bd97ce27c1f33f916ea6c652b7e44df3c8e8e15c1f0749de52bc5'),
        ('photos-var', 'var', (('kv_compression', 'scalekv'), ('kv_budget', 0.1))):
            ('ab0409957294655e90eac800a354f1c020a4090289df29eeb17505703a4dba73',
             'c7ad9ab947b863c413c1a6dd3b1e8e1827febef314b24134a7cb98d2ca9667da',
             '29b0eda39b0fb35d2e3b3c04008d17755b8b7108cad351ec0be516200861a8ea'),
    },
}


def host_class() -> str:
    """The kind of CPU kernels float32 bytes depend on: torch's CPU capability, and for AVX-512 the vendor (MKL and
    oneDNN run other kernels on Intel's AVX-512 than on AMD's)."""
    cap = torch.backends.cpu.get_cpu_capability()
    if cap != "AVX512":
        return cap
    vendor = "unknown"
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("vendor_id"):
                vendor = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{cap}/{vendor}"


def host_model() -> str:
    """The host class with the CPU's vendor and family (/proc/cpuinfo): within a class, float32 products can still
    round differently on another generation (its cache sizes change how MKL and oneDNN block a product)."""
    info = {}
    try:
        for line in open("/proc/cpuinfo"):
            key, _, value = line.partition(":")
            info.setdefault(key.strip(), value.strip())
            if not line.strip():
                break
    except OSError:
        pass
    return f"{host_class()}/{info.get('vendor_id', 'unknown')}/family {info.get('cpu family', '?')}"


HOST = host_class()
HOST_MODEL = host_model()
KNOWN_HOSTS = ("AVX2", *HOST_BYTES)


def host_table(tables: dict) -> dict:
    """This host's entries of a per-host table: its CPU family's (:func:`host_model`) over its class's."""
    return {**tables.get(HOST, {}), **tables.get(HOST_MODEL, {})}


def needs_known_host():
    if HOST not in KNOWN_HOSTS:
        pytest.skip(f"float32 bytes are recorded for {', '.join(KNOWN_HOSTS)} hosts; this one is {HOST}: record its "
                    "table with `python docs/scripts/golden_host.py` (the float64 cases run here)")


@contextlib.contextmanager
def one_thread():
    """Every case runs on one torch thread, as under the test workers (tests/conftest.py): multi-threaded products
    split their sums by thread, and on some hosts (Intel's AVX-512) that flips a token."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def png_bytes(images: torch.Tensor) -> bytes:
    out = b""
    for img in images:
        buf = io.BytesIO()
        Image.fromarray(img.permute(1, 2, 0).contiguous().numpy()).save(buf, format="PNG")
        out += buf.getvalue()
    return out


def digest(gen) -> tuple[str, str]:
    tok = gen.tokens.to(torch.int64).contiguous().numpy().tobytes()
    return hashlib.sha256(tok).hexdigest(), hashlib.sha256(png_bytes(gen.images)).hexdigest()


@pytest.fixture(scope="module")
def pipes():
    return {}


def golden_values(case, pipes) -> tuple[str, str, str]:
    """sha256 of (tokens, raw pixels, PNG bytes) of a GOLDEN case on this host."""
    model, sampler, options = case
    if model not in pipes:
        pipes[model] = vgen.load_pipeline(model)
    with one_thread():
        gen = pipes[model].generate(LABELS, sampler=sampler, seed=0, **dict(options))
    tokens, png = digest(gen)
    return tokens, hashlib.sha256(gen.images.contiguous().numpy().tobytes()).hexdigest(), png


QUICK_SAMPLERS = (None, "var")  # the others' golden bytes run in the full suite (quick loop: kept under 3 minutes)


@needs_zoo()
@pytest.mark.parametrize("case", [c if c[1] in QUICK_SAMPLERS else pytest.param(c, marks=pytest.mark.slow)
                                  for c in GOLDEN], ids=lambda c: "-".join(str(x) for x in c[:2]) + (
    "-" + ",".join(f"{k}={v}" for k, v in c[2]) if c[2] else ""))
def test_golden_bytes(case, pipes):
    needs_known_host()
    want = host_table(HOST_BYTES).get(case) or (GOLDEN[case][0], PIXELS[case], GOLDEN[case][1])
    tokens, pixels, png = golden_values(case, pipes)
    assert (tokens, pixels) == want[:2]
    if PIL.__version__ == PNG_PILLOW:
        assert png == want[2]


# Every sampler, draft source, acceptance rule and model order, recorded on the tree before the speculative core was
# split into scheduler x draft source x rule (issue 44): continuous batching (batch_size below the job), per-pass
# widths from given costs, every Jacobi init and coupling, the head's chain (block and token verification, LANTERN's
# and GSD's rules) and trees, video with a prompt (a prefix), NAR, and continuous tokens. Each case: labels (0, 3, 7,
# 12) (the first n where a case says so), seed 0, eager. (model, sampler, options, call arguments) -> (sha256 of the
# tokens, sha256 of the step map: the pass that decided each token, so a change of schedule fails too). Token ids are
# the same on AVX2 and AMD's AVX-512 hosts, three differ on Intel's (CORE_HOST); continuous tokens (float latents) are
# pinned per kind of host and for one torch thread (the tests' setting, tests/conftest.py): their float sums round
# differently with two threads. Recorded with docs/scripts/golden_cases.py (docs/scripts/golden_host.py per host).
W4 = (("window", 4),)
CORE = {
    ('photos-gpt', 'ar', (('draw', 'gumbel'),), ()):
        ('453163dc6a52f3499a89466b4a9a07bf3a36f3cd7fefff5c60850d7532a1fc56',
         'ef835eb9c371f618c6958654a7d25a1df1d12c09a53ecf66f9209fb882a8542d'),
    ('photos-gpt', 'sjd', (('window', 4), ('init', 'vertical')), (('batch_size', 3),)):
        ('3c75326374728cfbda98356c051177818d44754996ab512bc9a9862d3ac36bee',
         '1f9f7b527336ae3882d8c0087582c86f6adb1d728a0957443a5bee67413de1a7'),
    ('photos-gpt', 'sjd', (('window', 4), ('init', 'sample'), ('fresh_q', 'onehot')), ()):
        ('855511030915065e6916bb40395bded050ba9d49e50b50a37b14a6f8cba0a160',
         '74775af84aa543f744579b9ece7144a451dc115ff2a32ebe680f2ed5665f2d22'),
    ('photos-gpt', 'sjd', (('window', 4), ('coupling', 'maximal'), ('init', 'horizontal')), (('batch_size', 2),)):
        ('621338deb5aa89995e2e10ee4bd092f78b0abe453be62e55e45928323257e739',
         '0e3303fb14fbde201697d3be9e6716f88acf8f77cdb87ab09f3012904078c60f'),
    ('photos-gpt', 'sjd', (('window', 'auto'), ('costs', '1:1,2:1.2,4:1.5,8:2.5')), (('batch_size', 3),)):
        ('58f5e203eb02ee972153a4c2d2f9a340ad931484a459526607bc62ae3f920b17',
         '85b3a325ffeb9be119b01ac90c456819b93d1ad6cd3cd81597a84c9b934524c8'),
    ('photos-gpt', 'gsd', (('window', 4), ('coupling', 'maximal')), (('batch_size', 3),)):
        ('9f4fedeb86691ca951b4e07b4d9c7e371333cc8876d8a96189f3653312bc3816',
         'c5340e43a8f338a079e3b7a813a148ffac1ecd9493aa3186498529ff56b8b234'),
    ('photos-gpt', 'lantern', (('window', 8), ('lam', 2.0)), ()):
        ('bb391a13f8d92ce1647a3117fbb968b99db4f3fbb030aac3e7534663e9b54133',
         '83ace4f6a84b9d6f3e190b30306145ed4beb9afd6cacba4585bbc69784dfe69a'),
    ('photos-gpt', 'scd', (('window', 4),), (('batch_size', 3),)):
        ('453163dc6a52f3499a89466b4a9a07bf3a36f3cd7fefff5c60850d7532a1fc56',
         'f0bb532db3809d67efcb816cea85f939d944b91db3856456e95fe4d2b80133ba'),
    ('photos-gpt', 'scd', (('window', 4), ('init', 'sample')), ()):
        ('453163dc6a52f3499a89466b4a9a07bf3a36f3cd7fefff5c60850d7532a1fc56',
         'bf3453d2574645a2c45e9bd16cf2a63b8554b7c3dfca23a59569fdc629ae4acb'),
    ('photos-gpt', 'scd', (('window', 8), ('coupling', 'maximal')), ()):
        ('907a046c9c9bfa27d7c2373f45465d33d485287f982a736a4e71096b64a97549',
         '0aa34438606174a2ea419917ed2df00bdeb5a98fe5c43ecfb2c73f6574c0bf60'),
    ('photos-gpt', 'eagle', (('window', 8),), (('batch_size', 3),)):
        ('cdeee0d626f0dd3f388f55952d3599a3a69c51755453b54cecbe66da47d55cb9',
         '729b86b2d70d823d23413a149926b63b102432d0604c7a81d1ac7da52cabd8c2'),
    ('photos-gpt', 'eagle', (('window', 4), ('verify', 'token')), ()):
        ('199ac9c909a97e93432812f7ec77ce068d69373043f6107b95b66a88eed11efc',
         '55747b249cbe7fe6d3dbec2468c13e6c56d9536d9d60333bfb1f8d1888667e74'),
    ('photos-gpt', 'eagle', (('window', 8), ('accept', 'lantern')), ()):
        ('d1ae7fffcccdb992e922f3538c54a218cc1829f2e54df0c83f4c09ab94bc6b87',
         'e91a44abbe6db7baf165936f24ebbf410570ea18b835f0eeb919bc3432767e2d'),
    ('photos-gpt', 'eagle', (('window', 4), ('accept', 'gsd')), ()):
        ('332508c3f0e3e7288e1e5803f4e8b90101dd40bda0971b6f68301f97db9d0875',
         'c45940e7d2b5ea0fe0ed86c399629ec7018f37ad66c0cade14647ee11bb4c295'),
    ('photos-gpt', 'eagle', (('tree', 'lantern++'), ('window', 26)), (('batch_size', 3),)):
        ('7a14447acb673a6a80eafb242705327a1ddad0c51acef0f67d0f4d4a69b72f72',
         'b3960986a9aafcf09fd3ccdc70a58c78c3e163316824283545a9b3e075735584'),
    ('photos-gpt', 'eagle', (('tree', '3,2,1'), ('children', 'top'), ('window', 16)), ()):
        ('aad9e2f5e4a4110a107e8f84a3e6f4bab056b4ecf174da24360dbfd4f9726449',
         '3a93bd738588eae433b6010957b1a430368d3f133174510f21506440de9d7b6b'),
    ('photos-gpt', 'zipar', (('window', 4),), ()):
        ('10ed57ec5f82def7ae62b5cc554c44da2e9b5dc164c374f411053bc04e49c6ed',
         '9131c9c56b4b92d72d128d335cbeb23983387b81bc911e1ff44a3725e3a229b3'),
    ('photos-video-gpt', None, (), ()):
        ('704ab491f0f2ee299f93cedc32d9f1e320d4e8a42fa58f351bb17c7675e6102e',
         'e4be706b50c9101a0f8d717e9491ab2d4913ed93fe26ff8f58e85c788d5f90aa'),
    ('photos-video-gpt', 'sjd', (('window', 16), ('init', 'temporal')), (('batch_size', 3),)):
        ('da69918894a8490e66283ff3b7d2d64c668f116a9c5894b83ea6fcadd838ad92',
         'e9e40e9fa7b36bf845779569e6e4e257be39989361f0c243f80ffb1145c8d261'),
    ('photos-video-gpt', 'scd', (('window', 4),), (('prompt', 2),)):
        ('09d77b64a4d2f294bf9cb81148f227a7a36ad5f9470fa8d83ec2a55af5afeb22',
         'f3c9e87759d899d9d19831d13029ae35102ff8eab004d819c181acc5ea2599be'),
    ('photos-video-gpt', 'sjd', (('window', 4), ('init', 'temporal')), (('prompt', 2),)):
        ('0348a0ae7e650112d5b95484b704c00e300425aa18d850673e662169191b79ee',
         'ee87014407f5c0a7cef74aa7e331cc6779b37b3ec8125a9010bacaaca21d92c1'),
    ('photos-video-nar', None, (), ()):
        ('66a487aa2f45553f10a892d60f4cdda5d9ae8b5ea74b3c13d90f624ca3168ddd',
         'ff72034374d40dabb141c360dc29fef8b74cadc66443f333f77fe4026a700afc'),
    ('photos-nar', 'nar', (), (('batch_size', 3),)):
        ('f036a5fd293eeb26e0bfe66d42ec8bef81932636b16b303c6c6896eba874d109',
         '31b10b3ef70c5596fbc47a67eb2602d8557547aace0af0d4c8e67737e2597c36'),
}
# Per kind of host (host_class): the cases whose bytes differ from CORE there, and the continuous-token cases (float
# latents, recorded on AVX-512 hosts only; none for AVX2), at 20 of the head's reverse steps (MAR's 100 by default):
# the same code, a fifth of the time.
CONTINUOUS = (
    ('photos-car', None, (('num_sampling_steps', 20),), ()),
    ('photos-car', 'cspd', (('num_sampling_steps', 20),), (('n', 2),)),
    ('photos-mar', None, (('num_sampling_steps', 20),), ()),
)
# AVX2/AuthenticAMD/family 25: recorded 2026-11-29 on an AMD EPYC of family 25 (Zen 3: 512 KiB L2 per core, 32 MiB L3)
# whose torch capability is AVX2, with 0482c6d's code, which passed every table on the AVX2 hosts
# before: two speculative cases flip a token (a wide pass's float32 products block and round otherwise); their
# float64 cases (GOLDEN_F64) hold here.
CORE_HOST = {"AVX2/AuthenticAMD/family 25": {
    ('photos-gpt', 'sjd', (('window', 4), ('init', 'sample'), ('fresh_q', 'onehot')), ()):
        ('464b5ecce4d2d892b20127d5bf31071003de7926f885aa311c608f3f074ac7da',
         '90dd433f107b75070c4c5e41d2141e1ff4855e0fed57d6bce548b968fc5d4886'),
    ('photos-gpt', 'scd', (('window', 8), ('coupling', 'maximal')), ()):
        ('48724e03b19d9be715236abba9dfca95b6925e6ddccd0dd99a5970e0c22582ba',
         'b7492f91317753ac142523e08440ae468d2423c2ccbb4d86116c98c77a9e4e62'),
}, "AVX512/AuthenticAMD": {
    ('photos-car', None, (('num_sampling_steps', 20),), ()):
        ('c44cbed9bf1c6adb7b481a6457a5d3d57336e1a0c0b4e96b8aa94136ae74c9c9',
         'ef835eb9c371f618c6958654a7d25a1df1d12c09a53ecf66f9209fb882a8542d'),
    ('photos-car', 'cspd', (('num_sampling_steps', 20),), (('n', 2),)):
        ('9e9471d2829c0c2a0ca6cc7120560d6415b1c9286c7692de16eb00b732c5fe72',
         'e719d1a83387f5ba229cd9a670923a5fe5a7aeb50deb7a63e221ceea3a781ba4'),
    ('photos-mar', None, (('num_sampling_steps', 20),), ()):
        ('5cb23d41b6dbd35f7bdb3a7d84121fbf5eab235472870164a1d6dcbd912e2da6',
         '12a83a300a2b0e403ab15137bd81d6930a40e013e769805c44d642fdbd23cb80'),
}, "AVX512/GenuineIntel": {
    ('photos-gpt', 'sjd', (('window', 4), ('init', 'sample'), ('fresh_q', 'onehot')), ()):
        ('464b5ecce4d2d892b20127d5bf31071003de7926f885aa311c608f3f074ac7da',
         '90dd433f107b75070c4c5e41d2141e1ff4855e0fed57d6bce548b968fc5d4886'),
    ('photos-gpt', 'scd', (('window', 8), ('coupling', 'maximal')), ()):
        ('48724e03b19d9be715236abba9dfca95b6925e6ddccd0dd99a5970e0c22582ba',
         'b7492f91317753ac142523e08440ae468d2423c2ccbb4d86116c98c77a9e4e62'),
    ('photos-gpt', 'eagle', (('window', 4), ('verify', 'token')), ()):
        ('eaf3fa2bee404a6cbedc5cbb8bb4fd43d7f6e3a36d492e1f31954aa9255c249f',
         '55747b249cbe7fe6d3dbec2468c13e6c56d9536d9d60333bfb1f8d1888667e74'),
    ('photos-car', None, (('num_sampling_steps', 20),), ()):
        ('fd477c77f83e2f72a308bbb46dc6b4ed780dc045a6e2960befa4cb06e15d2133',
         'ef835eb9c371f618c6958654a7d25a1df1d12c09a53ecf66f9209fb882a8542d'),
    ('photos-car', 'cspd', (('num_sampling_steps', 20),), (('n', 2),)):
        ('63f32b1a06eece7bcbee0d6218f4ade847ef226fc70b7a975dc4874c0d04d4ec',
         'e719d1a83387f5ba229cd9a670923a5fe5a7aeb50deb7a63e221ceea3a781ba4'),
    ('photos-mar', None, (('num_sampling_steps', 20),), ()):
        ('73e74f9d324ca5463c2bbc3e709435a633cd3627cb546162dd631b0e18848e4a',
         '12a83a300a2b0e403ab15137bd81d6930a40e013e769805c44d642fdbd23cb80'),
}}


def core_ids(c):
    opts = ",".join(f"{k}={v}" for k, v in c[2])
    call = ",".join(f"{k}={v}" for k, v in c[3])
    return "-".join(x for x in (c[0], c[1] or "plain", opts, call) if x)


def _hash(t: torch.Tensor) -> str:
    t = t.contiguous()
    t = t.to(torch.float32) if t.is_floating_point() else t.to(torch.int64)
    return hashlib.sha256(t.numpy().tobytes()).hexdigest()


def core_values(case, pipes, dtype=None) -> tuple[str, str]:
    """sha256 of (tokens, step map) of a CORE case on this host (``dtype``: the model's, e.g. float64)."""
    model, sampler, options, call = case
    key = (model, dtype)
    if key not in pipes:
        pipes[key] = vgen.load_pipeline(model, dtype=dtype)
    call = dict(call)
    labels = LABELS[:call.pop("n", len(LABELS))]  # the slowest cases on the first labels only
    if "prompt" in call:  # the first frames of a test clip: frame-conditioned generation continues them
        call["prompt_frames"] = call.pop("prompt")
        call["prompt"] = vgen.data.clips("test", 1).videos[0]
    with one_thread():
        gen = pipes[key].generate(labels, sampler=sampler, seed=0, **call, **dict(options))
    return _hash(gen.tokens), _hash(gen.step_map)


@needs_zoo()
@pytest.mark.slow
@pytest.mark.parametrize("case", list(CORE) + list(CONTINUOUS), ids=core_ids)
def test_core_bytes(case, pipes):
    needs_known_host()
    want = host_table(CORE_HOST).get(case) or CORE.get(case)
    if want is None:
        pytest.skip(f"continuous tokens are recorded on {', '.join(CORE_HOST)} hosts; this one is {HOST}")
    assert core_values(case, pipes) == want


# The model in float64 (its tokenizer as stored): discrete tokens and step maps that hold on every host (the float32
# tables above move with the CPU's kernels; float64's rounding is ~1e-16, far below any sampling decision here).
# Checked the same under this Xeon's own kernels and under ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2
# MKL_ENABLE_INSTRUCTIONS=AVX2 (2026-11-27). The plain and sjd tokens are the float32 AVX2 tables' own.
GOLDEN_F64 = {
    ('photos-gpt', None, (), ()):
        ('e08695066fce7b7c7503fc52158182a1446e3eb9785767158ed264fcd83b89c1',
         'ef835eb9c371f618c6958654a7d25a1df1d12c09a53ecf66f9209fb882a8542d'),
    ('photos-gpt', 'sjd', (('window', 4), ('init', 'sample'), ('fresh_q', 'onehot')), ()):
        ('855511030915065e6916bb40395bded050ba9d49e50b50a37b14a6f8cba0a160',
         '74775af84aa543f744579b9ece7144a451dc115ff2a32ebe680f2ed5665f2d22'),
    ('photos-gpt', 'scd', (('window', 8), ('coupling', 'maximal')), ()):
        ('48724e03b19d9be715236abba9dfca95b6925e6ddccd0dd99a5970e0c22582ba',
         'b7492f91317753ac142523e08440ae468d2423c2ccbb4d86116c98c77a9e4e62'),
    ('photos-gpt', 'eagle', (('window', 4), ('verify', 'token')), ()):
        ('eaf3fa2bee404a6cbedc5cbb8bb4fd43d7f6e3a36d492e1f31954aa9255c249f',
         '55747b249cbe7fe6d3dbec2468c13e6c56d9536d9d60333bfb1f8d1888667e74'),
    ('photos-gpt', 'zipar', (('window', 4),), ()):
        ('10ed57ec5f82def7ae62b5cc554c44da2e9b5dc164c374f411053bc04e49c6ed',
         '9131c9c56b4b92d72d128d335cbeb23983387b81bc911e1ff44a3725e3a229b3'),
    ('photos-var', None, (), ()):
        ('bd7a5f4c32c7baac9f64dee76dde9a34b6adcae3970f4d1c293f6fa6f6d64c5b',
         'ea4263607c1a1187064b15fa92618eeca2d5343a92018773fc8166e7763e5484'),
    ('photos-nar', None, (), ()):
        ('f036a5fd293eeb26e0bfe66d42ec8bef81932636b16b303c6c6896eba874d109',
         '31b10b3ef70c5596fbc47a67eb2602d8557547aace0af0d4c8e67737e2597c36'),
}


@needs_zoo()
@pytest.mark.slow
@pytest.mark.parametrize("case", list(GOLDEN_F64), ids=core_ids)
def test_float64_bytes_on_any_host(case, pipes):
    assert core_values(case, pipes, torch.float64) == GOLDEN_F64[case]
