"""Repack wheels without files that the campaign never uses (other platforms' CBC binaries, test suites, locales)."""
import re, sys, zipfile, os, shutil
rules = {
    "pulp-": lambda n: ("solverdir/cbc/" in n and "/linux/i64/" not in n) or n.startswith("pulp/tests/"),
    "babel-": lambda n: n.startswith("babel/locale-data/") and not re.match(r"babel/locale-data/(en|ko|root)(_[^/]*)?\.dat$", n),
    "scipy-": lambda n: "/tests/" in n,
    "matplotlib-": lambda n: "/tests/" in n or "mpl-data/sample_data/" in n,
}
for w in sorted(os.listdir(sys.argv[1])):
    rule = next((r for p, r in rules.items() if w.startswith(p)), None)
    if not rule: continue
    path = os.path.join(sys.argv[1], w); tmp = path + ".tmp"
    with zipfile.ZipFile(path) as zi, zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as zo:
        dropped = set(n for n in zi.namelist() if rule(n))
        for info in zi.infolist():
            if info.filename in dropped: continue
            data = zi.read(info)
            if info.filename.endswith(".dist-info/RECORD"):
                data = "".join(l for l in data.decode().splitlines(True) if l.split(",")[0] not in dropped).encode()
            zo.writestr(info, data, compress_type=zipfile.ZIP_DEFLATED, compresslevel=9)
    before = os.path.getsize(path); os.replace(tmp, path)
    print(w, len(dropped), "files dropped", before >> 20, "->", os.path.getsize(path) >> 20, "MiB")
