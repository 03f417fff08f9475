//! Generates the `helloworld.Greeter` server and client with tonic-build's
//! manual builder: no `.proto` file and no `protoc` needed. The messages are
//! defined in `src/lib.rs` with prost's derive, field for field as in
//! gRPC's `helloworld.proto`.

fn main() {
    let say_hello = tonic_build::manual::Method::builder()
        .name("say_hello")
        .route_name("SayHello")
        .input_type("crate::HelloRequest")
        .output_type("crate::HelloReply")
        .codec_path("tonic_prost::ProstCodec")
        .build();
    let greeter = tonic_build::manual::Service::builder()
        .name("Greeter")
        .package("helloworld")
        .method(say_hello)
        .build();
    tonic_build::manual::Builder::new().compile(&[greeter]);
}
