import sys, statistics as st
for f in sys.argv[1:]:
    rows=[l.split() for l in open(f) if len(l.split())==4]
    a=[float(r[3]) for r in rows if r[1]=='A']; b=[float(r[3]) for r in rows if r[1]=='B']
    pairs=[(float(x[3]),float(y[3])) for x,y in zip(rows[0::2],rows[1::2])]
    ratios=[x/y for x,y in pairs]
    q=lambda v,p: sorted(v)[int(p*(len(v)-1))]
    print(f"{f}: n={len(a)}/{len(b)} median A(check on)={st.median(a):.2f} us  B(check off)={st.median(b):.2f} us  A/B={st.median(a)/st.median(b):.3f}; "
          f"A q25-q75 {q(a,.25):.2f}-{q(a,.75):.2f}, B q25-q75 {q(b,.25):.2f}-{q(b,.75):.2f}; median of paired A/B {st.median(ratios):.3f}")
