"""Analysis: report data, figures and the `stitchtune report` files of tuning databases; the kernel audit
without a GPU (`stitchtune audit`: audit, sectors, sass, triton_peer, audit_report)."""
