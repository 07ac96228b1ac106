import sys, time
sys.argv=['x']
import check
inp = check.make_inputs()
ref = check.reference(inp[1], inp[2], inp[3], inp[4], 64, True)
for solve in sys.stdin.read().split():
    s, p = solve.split(':')
    t0=time.time()
    w,u,_ = check.run_proto(inp, 64, s, p, True)
    print(s, p, check.fmt(check.errors(w, ref[0], 64)), '|', check.fmt(check.errors(u, ref[1], 64)), f'{time.time()-t0:.1f}s', flush=True)
